# ship_results.py: python examples/ship_results.py
# Calibrate on the machines you support, export, ship the file with the app: on a machine it holds, the app's
# first best_config is answered from it, with no measurement (the reason names the file).
import os
import sys
import tempfile
from pathlib import Path

import autotune

from my_app.models import build


def export(results: Path) -> None:
    """On your machine: measure, then write every record the cache holds (python -m autotune --export FILE)."""
    autotune.calibrate(["classifier"])
    autotune.export_results(results, ["classifier"])


def first_launch(results: Path) -> autotune.Config:
    """In the app, on the user's machine: the shipped file under the user's (here empty) cache, read-only."""
    autotune.use_defaults(results)            # or AUTOTUNE_DEFAULTS=/path/to/results.json
    return autotune.best_config("classifier", wait=False)


def main() -> autotune.Config:
    autotune.register_family("classifier", build)
    results = Path(tempfile.mkdtemp()) / "results.json"
    export(results)
    os.environ["AUTOTUNE_CACHE_DIR"] = tempfile.mkdtemp()   # a user's machine: nothing measured yet
    cfg = first_launch(results)
    print(cfg.source, "-", cfg.reason)   # "measured - ... (shipped in results.json)"
    return cfg


if __name__ == "__main__":
    sys.exit(0 if main().source == "measured" else 1)
