"""The warm path: a fresh process answered from the cache, against `import torch` alone.

Prints the ratio of medians over interleaved runs, and the in-process cost of a repeated call.

    python benchmarks/warm_lookup.py [RUNS]
"""

from __future__ import annotations

import compileall
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from _common import emit

import autotune

KIND = "cnn"


def _wall(code: str, env: dict[str, str]) -> float:
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, env=env)
    return time.perf_counter() - started


def main() -> None:
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 15
    env = dict(os.environ)  # the user's real cache dir unless AUTOTUNE_CACHE_DIR says otherwise
    autotune.best_config(KIND)  # make sure the cache is warm (calibrates once if needed)
    # Each process reads autotune's bytecode, as an installed copy has it (pip compiles it at install), not its source:
    # under PYTHONDONTWRITEBYTECODE a source checkout would otherwise be compiled anew in every timed process.
    compileall.compile_dir(Path(autotune.__file__).parent, quiet=1)
    lookup = f"import autotune; autotune.best_config({KIND!r}, calibrate_on_miss=False)"
    baseline, ours = [], []
    for _ in range(runs):
        baseline.append(_wall("import torch", env))
        ours.append(_wall(lookup, env))
    emit({"benchmark": "warm_lookup", "kind": "fresh_process", "runs": runs,
          "import_torch_s": round(statistics.median(baseline), 3),
          "best_config_s": round(statistics.median(ours), 3),
          "ratio": round(statistics.median(ours) / statistics.median(baseline), 3)})
    calls = 20_000
    autotune.best_config(KIND)
    started = time.perf_counter()
    for _ in range(calls):
        autotune.best_config(KIND)
    per_call_us = 1e6 * (time.perf_counter() - started) / calls
    emit({"benchmark": "warm_lookup", "kind": "in_process", "calls": calls, "us_per_call": round(per_call_us, 1)})


if __name__ == "__main__":
    main()
