"""What safety costs: a full calibration of the built-in families with vs without each safeguard.

- isolation: every family in a spawned worker (default) vs in this process (AUTOTUNE_ISOLATION=inprocess);
- verification: the numerics gate's checked steps vs the same steps unchecked;
- staged search: the default search (precision, then layout, optimizer, threads) vs precision only.

Each variant runs in a fresh interpreter, interleaved, ``RUNS`` times; prints medians and their ratio.

    python benchmarks/overheads.py [RUNS]
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time

from _common import BUILTINS, emit

CALIBRATE = (
    "import sys, autotune; from autotune._calibrate import measure_family;"
    "[measure_family(k, verify=sys.argv[1] == '1') for k in sys.argv[2:]]"
)


def _wall(env: dict[str, str], verify: bool) -> float:
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", CALIBRATE, "1" if verify else "0", *BUILTINS], check=True,
                   capture_output=True, env={**os.environ, "AUTOTUNE_CACHE_DIR": tempfile.mkdtemp(), **env})
    return time.perf_counter() - started


def main() -> None:
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    variants = {
        "worker_verified": ({"AUTOTUNE_ISOLATION": "subprocess"}, True),
        "inprocess_verified": ({"AUTOTUNE_ISOLATION": "inprocess"}, True),
        "worker_unverified": ({"AUTOTUNE_ISOLATION": "subprocess"}, False),
        "worker_precision_only": ({"AUTOTUNE_ISOLATION": "subprocess", "AUTOTUNE_SEARCH": "precision"}, True),
    }
    walls: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(runs):
        for name, (env, verify) in variants.items():
            walls[name].append(_wall(env, verify))
    median = {name: statistics.median(values) for name, values in walls.items()}
    emit({"benchmark": "overheads", "what": "isolation", "runs": runs,
          "worker_s": round(median["worker_verified"], 2), "inprocess_s": round(median["inprocess_verified"], 2),
          "ratio": round(median["worker_verified"] / median["inprocess_verified"], 3)})
    emit({"benchmark": "overheads", "what": "verification", "runs": runs,
          "verified_s": round(median["worker_verified"], 2), "unverified_s": round(median["worker_unverified"], 2),
          "ratio": round(median["worker_verified"] / median["worker_unverified"], 3)})
    emit({"benchmark": "overheads", "what": "staged_search", "runs": runs,
          "default_search_s": round(median["worker_verified"], 2),
          "precision_only_s": round(median["worker_precision_only"], 2),
          "ratio": round(median["worker_verified"] / median["worker_precision_only"], 3)})


if __name__ == "__main__":
    main()
