"""PyInstaller's hook for autotune: the modules its lazy public names and its worker load by name."""

from PyInstaller.utils.hooks import collect_submodules

hiddenimports = collect_submodules("autotune", filter=lambda name: not name.startswith("autotune._pyinstaller"))
# GuardCallback's module imports Lightning only for an app that uses it: such an app imports Lightning itself.
excludedimports = ["lightning", "pytorch_lightning"]
