"""autotune's PyInstaller hooks, found through the ``pyinstaller40`` entry point: ``pyinstaller app.py`` bundles every
autotune module (the public names load lazily, which PyInstaller's analysis cannot follow) and runs
``autotune.freeze_support()`` before the app's main, so the frozen app can be its own calibration worker."""

from __future__ import annotations

from pathlib import Path


def get_hook_dirs() -> list[str]:
    """The directory holding ``hook-autotune.py`` and the runtime hook's ``rthooks.dat``."""
    return [str(Path(__file__).parent)]
