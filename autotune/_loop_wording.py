"""The words of a training loop for people: what the guard found (a demotion, its replay), a loop bound by its
data, what a run saw of its loop, and why ``dataloader_kwargs`` chose a setting. Pure: words from records."""

from __future__ import annotations

from collections.abc import Sequence

from autotune._records import Candidate, Demotion, Replay
from autotune._reports import LoaderTrial, LoopSummary
from autotune._variants import FP32
from autotune._wording import ratio_words, time_words


def demotion_words(demotion: Demotion) -> str:
    """e.g. ``'cpu bf16-mixed demoted on 2026-12-03 after NaN losses from step 5,120 (a run of Sequential
    5c3e2a09d1f4 on cpu bf16-mixed: 3 non-finite losses within 100 steps ...)'``"""
    model = f" of {demotion.model}" if demotion.model else ""
    return (f"{demotion.candidate.device} {demotion.candidate.precision} demoted on {demotion.at[:10]} after "
            f"{demotion.words} from step {demotion.step:,} (a run{model} on {demotion.candidate.label}: "
            f"{demotion.detail})")


def replay_words(replay: Replay, run: Candidate) -> str:
    """What the guard's replay found, e.g. ``'replayed from step 300 on the 50 batches since, fp32 misbehaves too
    (at replayed step 31): it is the training, not the configuration'``."""
    if replay.blame == "unreplayed":
        return f"not replayed: {replay.detail}"
    batches = (f"the {replay.steps:,} batches since" if replay.steps == replay.since
               else f"the last {replay.steps:,} of the {replay.since:,} batches since")
    where = f"replayed from step {replay.from_step:,} on {batches}"
    reference = FP32.name if replay.reference is None or replay.reference.device == run.device \
        else f"{replay.reference.device} {FP32.name}"
    # a replay that could not reproduce the loop says what of it, and how it judged instead
    unlike = f" ({replay.detail})" if replay.detail else ""
    if replay.blame == "training":
        return f"{where}, {reference} misbehaves too (at replayed step {replay.reference_at}){unlike}: it is the " \
               "training, not the configuration"
    if replay.blame == "configuration":
        return f"{where}, {run.precision} misbehaves again (at replayed step {replay.run_at}) and {reference} does " \
               f"not{unlike}"
    if unlike:
        return f"{where}, neither {run.precision} nor {reference} misbehaves{unlike}"
    return f"{where}, neither {run.precision} nor {reference} misbehaves: the batches that did are gone"


def data_bound_words(share: float, steps: int, speedup: float | None) -> str:
    """The guard's line for a data-bound loop, e.g. ``'training waited for data 62% of the time over the last 150
    steps; the step is 3.8x faster than fp32 but the loop is data-bound: try DataLoader(dataset,
    **cfg.dataloader_kwargs(dataset, batch_size=...))'``"""
    step = f"the step is {ratio_words(speedup)} faster than fp32 but " if speedup is not None and speedup > 1 else ""
    return (f"training waited for data {share:.0%} of the time over the last {steps:,} steps; {step}the loop is "
            "data-bound: try DataLoader(dataset, **cfg.dataloader_kwargs(dataset, batch_size=...))")


def loop_words(summary: LoopSummary) -> str:
    """What a training run saw of its loop, for ``--explain`` beside the measured step, e.g. ``'in training on
    2026-12-04 (cpu bf16-mixed, 1,200 steps): 62% waiting for data; per training step 75 ms of data, 46 ms of
    step (46 ms measured)'``"""
    where = f"in training on {summary.at[:10]} ({summary.candidate.label}, {summary.batches:,} steps)"
    if summary.data_wait_share is None or summary.data_ms is None or summary.step_ms is None:
        return f"{where}: no batch timed"
    measured = f" ({time_words(summary.measured_step_ms)} measured)" if summary.measured_step_ms else ""
    return (f"{where}: {summary.data_wait_share:.0%} waiting for data; per training step "
            f"{time_words(summary.data_ms)} of data, {time_words(summary.step_ms)} of step{measured}")


def loader_reason(chosen: LoaderTrial, trials: Sequence[LoaderTrial], *, step_ms: float | None, kept_up: bool,
                  workers_failed: bool, wall_s: float, budget_s: float) -> str:
    """Why ``dataloader_kwargs`` chose ``chosen``, per training step, and what measuring it cost, e.g.
    ``'num_workers=2 with 1 training thread: the cheapest setting that kept up with the training step (52 ms per
    training step, the step alone 49 ms; without workers 95 ms); measured in 3.1 s (budget 5 s)'``; where no setting
    with workers could run (``workers_failed``), each one's cause; ``step_ms`` None: no step time was recorded, the
    loader was measured alone."""
    setting = f"num_workers={chosen.num_workers}"
    if chosen.num_threads is not None:
        setting += f" with {chosen.num_threads} training thread{'s' if chosen.num_threads != 1 else ''}"
    if chosen.prefetch_factor not in (None, 2):
        setting += f" and prefetch_factor={chosen.prefetch_factor}"
    loop = (f"{time_words(chosen.loop_ms or 0.0)} per training step, the step alone {time_words(step_ms)}"
            if step_ms is not None else
            f"{time_words(chosen.loop_ms or 0.0)} per batch, the loader alone: this config has no step time recorded")
    without = next((t for t in trials if t.num_workers == 0 and t.loop_ms is not None), None)
    if without is not None and chosen.num_workers:
        loop += f"; without workers {time_words(without.loop_ms or 0.0)}"
    cost = f"; measured in {wall_s:.1f} s (budget {budget_s:g} s)"
    ruled_out = [t for t in trials if t.failure is not None]
    if workers_failed:
        return (f"{setting}: no setting with workers could run, so this answer is not kept ({loop}, "
                f"{chosen.data_wait_share or 0.0:.0%} of it waiting for data{cost}): "
                + "; ".join(f"num_workers={t.num_workers}: {t.failure}" for t in ruled_out))
    if kept_up:
        what = "the loop kept up with the training step without workers" if not chosen.num_workers else \
            "the cheapest setting that kept up with the training step"
        why = f"{setting}: {what} ({loop})"
    elif step_ms is None:
        why = f"{setting}: the fastest setting ({loop})"
    else:
        why = (f"{setting}: the fastest setting, though none kept up with the training step ({loop}, "
               f"{chosen.data_wait_share or 0.0:.0%} of it waiting for data)")
    if ruled_out:
        why += "; ruled out: " + "; ".join(f"num_workers={t.num_workers} ({t.failure})" for t in ruled_out)
    return why + cost


__all__ = ["data_bound_words", "demotion_words", "loader_reason", "loop_words", "replay_words"]
