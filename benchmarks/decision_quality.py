"""How good the picks are: an in-process oracle against the picks of independent calibrations.

For each family 5 independent cold calibrations (each in its own worker, as in production) pick; then the
oracle times the whole search space (precision x layout x optimizer x threads) in-process, the contenders
for 200 steps each in interleaved blocks of at least 10 ms (``_common.oracle``), then the picks and every
candidate within 5% of the fastest together until their ratios to it are known to +-0.3% (at most a minute).
regret = oracle time of the pick / oracle time of the best - 1. Also prints how often the 5 picks agreed and
which calibrations were flagged noisy (served, measured again by the next ``calibrate()``) and why (``why``: the
causes each recorded, e.g. ``["other_processes"]``), and ``headlines``: the figure each calibration's reason states
for its pick against plain fp32 on its device ("~2.48x" an estimate, ">=1.6x" a bound) beside the oracle's ratio of
the same two (goal: estimates within 10%).

    python benchmarks/decision_quality.py [FAMILY ...]
"""

from __future__ import annotations

import collections
import math
import os
import tempfile

from _common import emit, families_from_argv, oracle, picked, stated_headline

from autotune._calibrate import measure_family
from autotune._decide import decide

CALIBRATIONS = 5
#: the oracle resolves the ratios of the picks and of every candidate this close to the fastest to +-0.3%
RESOLVE = 0.05


def main() -> None:
    os.environ["AUTOTUNE_CACHE_DIR"] = tempfile.mkdtemp(prefix="autotune-bench-")
    worst = 0.0
    for kind in families_from_argv():
        picks, tried, noisy, why, stated = [], [], [], [], []
        for _ in range(CALIBRATIONS):
            measured = measure_family(kind)
            stated.append(stated_headline(decide(measured, digest="benchmark")))
            pick = picked(measured)
            picks.append(pick.label)
            tried.append(pick)
            noisy.append(measured.noisy)
            why.append(measured.noisy_because)
        errors: dict[str, float] = {}
        truth = oracle(kind, extra=tried, resolve=RESOLVE, errors=errors)
        best = min(truth.values())
        regrets = [truth[p] / best - 1 for p in picks]
        worst = max(worst, *regrets)
        _, count = collections.Counter(picks).most_common(1)[0]
        # each stated headline over the oracle's ratio of the same two, "~" an estimate, ">=" a bound
        headlines = [None if s is None or s[0].label not in truth else
                     f"{'>=' if s[2] else '~'}{s[1]:.2f}x vs {truth[s[0].label] / truth[p]:.2f}x"
                     for s, p in zip(stated, picks, strict=True)]
        emit({
            "benchmark": "decision_quality", "family": kind,
            "oracle_ms": {k: round(v, 3) for k, v in truth.items()},
            "oracle_best": min(truth, key=truth.__getitem__),
            "picks": picks, "same_pick": f"{count}/{CALIBRATIONS}", "noisy": noisy, "why": why,
            "oracle_se_pct": {k: round(100 * v, 2) if math.isfinite(v) else None for k, v in errors.items()},
            "max_regret_pct": round(100 * max(regrets), 2),
            "mean_regret_pct": round(100 * sum(regrets) / len(regrets), 2),
            "headlines": headlines,
        })
    emit({"benchmark": "decision_quality", "family": "ALL", "worst_regret_pct": round(100 * worst, 2)})


if __name__ == "__main__":
    main()
