"""``python -m autotune`` and the ``autotune`` script; the command line itself is ``autotune._cli``."""

import sys


def run() -> int:
    """The command line, with its calibration worker started first when the arguments may measure: the
    worker's start (an interpreter, torch, its first optimizer) overlaps the host's own ``import torch``."""
    from autotune import _cli
    from autotune._worker import launch

    if _cli.may_measure():  # a usage error exits here, before any worker starts
        launch.start_early()
    try:
        return _cli.main()
    finally:
        launch.discard()


if __name__ == "__main__":
    sys.exit(run())
