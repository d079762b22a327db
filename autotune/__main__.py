"""``python -m autotune`` and the ``autotune`` script; the command line itself is ``autotune._cli``."""

import sys

from autotune import _args
from autotune._lab.host import launch
from autotune._version import __version__


def run() -> int:
    """The command line, with its calibration worker started first when the arguments may measure: the
    worker's start (an interpreter, torch, its first optimizer) overlaps the host's own ``import torch``."""
    if _args.may_measure(__version__):  # a usage error or --version exits here, before any worker starts
        launch.start_early()
    try:
        from autotune import _cli  # loads torch: after the early start

        return _cli.main()
    finally:
        launch.discard()


if __name__ == "__main__":
    sys.exit(run())
