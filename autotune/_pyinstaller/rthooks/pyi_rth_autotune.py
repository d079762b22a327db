"""Before the app's main: a frozen app started as autotune's calibration worker becomes the worker and exits."""


def _autotune_freeze_support() -> None:
    from autotune._lab.entry import freeze_support

    freeze_support()


_autotune_freeze_support()
