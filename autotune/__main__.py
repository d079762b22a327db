"""``python -m autotune``; see ``autotune._cli``."""

import sys

from autotune._cli import main

sys.exit(main())
