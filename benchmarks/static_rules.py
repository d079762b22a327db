"""The autotuned pick against the static rules users write today, timed by the same in-process oracle.

Rules: "fp32 everywhere" and "bf16 whenever the hardware supports it" (here: CPU bf16 autocast is
available, so bf16 everywhere), both with torch's defaults otherwise (contiguous layout, default AdamW, all
threads). A ratio > 1 means the rule's config is slower than autotune's pick.

    python benchmarks/static_rules.py [FAMILY ...]
"""

from __future__ import annotations

import math
import os
import tempfile

from _common import emit, families_from_argv, oracle, picked

import autotune
from autotune._answer import cached_families

RULES = {"fp32_everywhere": "cpu fp32", "bf16_when_supported": "cpu bf16-mixed"}


def main() -> None:
    os.environ["AUTOTUNE_CACHE_DIR"] = tempfile.mkdtemp(prefix="autotune-bench-")
    ratios: dict[str, list[float]] = {rule: [] for rule in RULES}
    for kind in families_from_argv():
        autotune.best_config(kind)
        candidate = picked(cached_families([kind])[kind])
        truth = oracle(kind, extra=[candidate])
        pick = candidate.label
        record = {"benchmark": "static_rules", "family": kind, "autotune_pick": pick,
                  "autotune_ms": round(truth[pick], 3)}
        for rule, label in RULES.items():
            ratio = truth[label] / truth[pick]
            ratios[rule].append(ratio)
            record[f"{rule}_ms"] = round(truth[label], 3)
            record[f"{rule}_vs_autotune"] = round(ratio, 3)
        emit(record)
    emit({"benchmark": "static_rules", "family": "GEOMEAN", **{
        f"{rule}_vs_autotune": round(math.exp(sum(map(math.log, values)) / len(values)), 3)
        for rule, values in ratios.items()
    }, "min_ratio": round(min(min(v) for v in ratios.values()), 3)})


if __name__ == "__main__":
    main()
