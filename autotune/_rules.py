"""The decision rules that measurement and decision share: the margin and what counts as simpler.

The calibration prunes with these rules and ``_decide`` picks with them, so both live here, once.
"""

from __future__ import annotations

from autotune import _variants
from autotune._records import Candidate

#: a lower precision or another device must be faster by more than this (with the decision's confidence)
#: to beat the simpler choice: it costs the user numerics headroom, or a driver, device memory and copies
MARGIN = 0.03
#: how much more than its margin a pick may be slower than the best before the decision counts as wrong: the
#: indifference zone that bounds the rounds a close call costs (a pair whose true gap sits exactly on its margin
#: would otherwise be timed forever). Settings of the same math have no margin and a few percent of indifference:
#: a 1% near-tie may go either way, a 4-5% gap may not
INDIFFERENCE = 0.01
SAME_MATH_INDIFFERENCE = 0.03
#: a speed-up is stated as measured when its interval lies within this of the estimate, else as the bound the
#: interval shows; the calibration times the pick against plain fp32 on its device until it lies within, where
#: that costs at most ``HEADLINE_COST`` x the calibration's time so far
HEADLINE_ERROR = 0.10
HEADLINE_COST = 0.10
#: that timing's interval is a 95% one (each bound 2.5%), as a figure stated is: no decision rests on it (fp32 was
#: already found slower), so it does not spend the looks' error
HEADLINE_ALPHA = 0.025

#: where the rules a result is measured by live: the rules digest (``_cache.freshness.rules_digest``) reads every
#: public UPPER_CASE constant these modules define, with the calibration settings' defaults. A module of the
#: worker's package is either here or named as no rule by the test that walks the package.
RULE_MODULES = (
    "autotune._rules", "autotune._stats", "autotune._lab.clocks", "autotune._lab.load", "autotune._lab.looks",
    "autotune._lab.measure", "autotune._lab.plan", "autotune._lab.prepare", "autotune._lab.probe",
    "autotune._lab.roster", "autotune._lab.session", "autotune._lab.step", "autotune._lab.verify",
)

def margin(a: Candidate, b: Candidate) -> float:
    """How much faster one of ``a`` and ``b`` must be, with confidence, to be picked over the other.

    Different devices or precisions: :data:`MARGIN` (numerics headroom; a driver, device memory and copies).
    Settings of the same math (CPU thread count, memory format, optimizer kernels, compilation) cost the user
    nothing, so they need only be confidently faster; a thread count's tie still goes to torch's own
    (:func:`tie_winner`). A machine steadily busy while it calibrates can make fewer threads look faster than
    they will be later; ``--check`` re-times the runner-up thread count.
    """
    if a.device != b.device or a.precision != b.precision:
        return MARGIN
    return 0.0


def indifference(a: Candidate, b: Candidate) -> float:
    """How far past the pair's margin a wrong answer may be before more rounds are owed (:data:`INDIFFERENCE`)."""
    return INDIFFERENCE if margin(a, b) > 0 else SAME_MATH_INDIFFERENCE


def preference(candidate: Candidate) -> tuple[int, ...]:
    """Among candidates nothing clearly beats, lower is preferred before speed: fp32 < tf32 < bf16 < fp16
    (numerics headroom), then torch's own setting of each preferred variant axis in turn (its thread count, then
    eager over compiled). Layout and optimizer kernels (the same math) are left to speed: the faster estimate
    costs nothing if the difference is not real."""
    return _variants.simplicity(candidate.precision), *(
        getattr(candidate, axis.field) != axis.default for axis in _variants.AXES if axis.preferred)


def tie_winner(a: Candidate, b: Candidate) -> Candidate | None:
    """Which of ``a`` and ``b`` wins when neither is faster by more than their margin: the CPU over another
    device, then the preferred one (:func:`preference`); None where the faster one wins (two accelerators,
    two thread counts other than torch's, layout and optimizer kernels)."""
    if a.device != b.device:
        cpu = [c for c in (a, b) if c.device == _variants.CPU]
        return cpu[0] if cpu else None
    if preference(a) == preference(b):
        return None
    return a if preference(a) < preference(b) else b


def is_open(ratio: tuple[float, float, float], margin: float, indifference: float, *, tie_to_pick: bool) -> bool:
    """Can more rounds still move a pick by more than its pair with another candidate allows? ``ratio``: the
    (estimate, low, high) of the pick's step time over the other's, the pick being the one the decision prefers
    on the rounds so far (neither clearly slower). Where a tie goes to the pick (``tie_to_pick``) it may be up to
    margin + indifference slower; where speed decides, up to the larger of the two."""
    return ratio[2] >= 1 + (margin + indifference if tie_to_pick else max(margin, indifference))


def known(ratio: tuple[float, float, float], error: float = HEADLINE_ERROR) -> bool:
    """Does the interval (estimate, low, high) lie within ``error`` of its estimate?"""
    estimate, low, high = ratio
    return low >= estimate / (1 + error) and high <= estimate * (1 + error)


def complexity(candidate: Candidate) -> tuple[int, int]:
    """Lower is simpler: the CPU, then fp32 < tf32 < bf16 < fp16, then each non-default variant adds one."""
    return _variants.simplicity(candidate.precision), len(_variants.changed(candidate))


__all__ = [
    "HEADLINE_ALPHA", "HEADLINE_COST", "HEADLINE_ERROR", "INDIFFERENCE", "MARGIN", "RULE_MODULES",
    "SAME_MATH_INDIFFERENCE", "complexity", "indifference", "is_open", "known", "margin", "preference", "tie_winner",
]
