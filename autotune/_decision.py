"""The decision as data: which device, precision and variants to train with, why, and the evidence. Made by
``_decide``, answered by ``_answer`` and agreed by ``_ranks``; :class:`autotune.Config` adds the methods that apply
it (torch, the frameworks, the guard) and is built only where an answer leaves for the app."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from autotune._records import Candidate, Choice, Evidence, Ranks

Source = Literal["measured", "forced", "heuristic"]


class Decision(Choice):
    """The answer's fields (documented on :class:`autotune.Config`, which adds only methods): the measured
    candidate's device, precision and variants, the reason, the evidence, and what was measured of the pick."""

    model_kind: str
    source: Source
    reason: str
    evidence: Evidence | None = Field(default=None, repr=False, description=(
        "every other candidate against the pick, and what qualifies the answer; None in a Config made by hand "
        "or by an older autotune (left out of repr(): thousands of characters; print cfg.evidence)"))
    step_ms: float | None = None
    setup_s: float | None = None
    speedup_vs_fp32_cpu: float | None = None
    init_scale: float | None = None
    peak_memory_mb: float | None = Field(default=None, description=(
        "the most memory the measured training steps held at once, in MiB, e.g. 61.5: on the CPU what the "
        "process's resident size rose by (Linux); on a GPU allocated memory; None where it was not measured"))
    noisy: bool = False
    fingerprint_digest: str
    measured_at: str | None = None
    ranks: Ranks | None = Field(default=None, description=(
        "the job of many processes this answer was agreed for, and this process's place in it; None: one process"))

    @property
    def candidate(self) -> Candidate:
        """The measured candidate this Config applies, e.g. ``Candidate(device="cpu", precision="bf16-mixed")``."""
        return Candidate(**{name: getattr(self, name) for name in Choice.model_fields})

    @property
    def device_type(self) -> str:
        """``'cuda'`` for ``'cuda:1'``: what ``torch.autocast`` and ``GradScaler`` take."""
        return self.device.split(":", 1)[0]


__all__ = ["Decision", "Source"]
