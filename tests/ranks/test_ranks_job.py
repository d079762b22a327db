"""What a job shares beyond its answer, its ranks in this process over a real gloo group: the guard's finding and
its fallback (a collective), the loop summary kept once per machine, Lightning's keywords for many processes, each
CPU candidate timed with copies of its step running, the job's own fingerprint.
"""

from __future__ import annotations

import logging
import time
import warnings
from pathlib import Path

import pytest
import torch
from gloo_for_tests import in_ranks

import autotune
from autotune import Config, ConfigMisbehaved, ConfigurationError, FrameworkError, RanksError
from autotune._cache import demotions, loops
from autotune._fingerprint import default_threads
from autotune._guard.watch import Guard
from autotune._ranks.group import JobGroup
from autotune._records import Candidate, Ranks


def _fp16_run(job: JobGroup, *, huge_from: int | None) -> Guard:
    """Ten steps of a tiny classifier in fp16 autocast under a guard that can replay; from step ``huge_from`` on
    rank 1 the inputs are 1e5 times larger: fp16 activations overflow (NaN losses), fp32 ones do not."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)

    def loss_fn(model: torch.nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        return torch.nn.functional.cross_entropy(model(batch[0]), batch[1])

    fp16 = Candidate(device="cpu", precision="fp16-mixed")
    guard = Guard("tiny", fp16, "digest", read_every=10, job=job, model=model, optimizer=optimizer, loss_fn=loss_fn)
    features, labels = torch.randn(32, 8), torch.randint(0, 4, (32,))
    for step in range(1, 11):
        huge = huge_from is not None and job.launch.rank == 1 and step >= huge_from
        batch = (features * (1e5 if huge else 1.0), labels)
        with torch.autocast("cpu", dtype=torch.float16):
            loss = loss_fn(model, batch)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        guard.step(loss, batch=batch)
    return guard


def test_a_guard_finding_on_one_rank_is_the_jobs(caplog: pytest.LogCaptureFixture) -> None:
    """Rank 1's batches overflow fp16; rank 0's machine leader records the demotion on rank 1's replay, which
    only rank 1 can run (its batches showed it)."""

    def train(job: JobGroup) -> Guard:
        return _fp16_run(job, huge_from=6)

    with warnings.catch_warnings(record=True) as warned, caplog.at_level(logging.INFO, logger="autotune"):
        warnings.simplefilter("always")
        guards = in_ranks(["0", "0"], train)
    findings = [g.finding for g in guards if isinstance(g, Guard)]
    assert len(findings) == 2 and findings[0] is not None and findings[1] is not None
    assert findings[0].model_dump(exclude={"at", "evidence"}) == findings[1].model_dump(exclude={"at", "evidence"})
    assert findings[0].step == 6 and findings[0].detail.endswith(", on rank 1")
    assert findings[0].replay is not None and findings[0].replay.blame == "configuration"
    assert findings[0].replay == findings[1].replay  # rank 1's replay, on both ranks
    assert len(demotions.of("digest", "tiny")) == 1  # one demotion: the machine's first rank records it
    assert sum(isinstance(w.message, ConfigMisbehaved) for w in warned) == 2  # every rank warned
    assert sum("misbehaved at step 6" in record.getMessage() for record in caplog.records) == 2


def test_guard_fallback_is_a_collective_a_rank_calling_it_alone_raises_within_the_loops_timeout() -> None:
    fp32 = Candidate(device="cpu", precision="fp32")

    def alone(job: JobGroup) -> object:
        if job.launch.rank == 1:
            time.sleep(6)  # alive, its group open, training on: it never calls guard.fallback()
            return None
        return Guard("tiny_mlp", fp32, "digest", job=job, answer=autotune.best_config).fallback()

    first, _ = in_ranks(["0", "0"], alone, loop_timeout_s=2.0)
    assert isinstance(first, RanksError)
    assert "rank 0 waited for the other ranks to call guard.fallback() too (in a job every rank calls it, as every " \
        "rank calls best_config) (at most AUTOTUNE_RANKS_LOOP_TIMEOUT_S=2 s) and got: " in str(first)

    def reading(job: JobGroup) -> object:
        guard = Guard("tiny_mlp", fp32, "digest", read_every=1, job=job, answer=autotune.best_config)
        if job.launch.rank == 1:
            guard.step(1.0)  # the guard's read: an exchange every rank makes at the same step
            return None
        return guard.fallback()

    for result in in_ranks(["0", "0"], reading):
        assert isinstance(result, RanksError)
        assert "was at the guard's read at step 1 while rank" in str(result) \
            or "was at guard.fallback() while rank 1 was at the guard's read at step 1" in str(result)

    together = in_ranks(["0", "0"], lambda job: Guard("tiny_mlp", fp32, "digest", job=job,
                                                      answer=autotune.best_config).fallback())
    assert all(isinstance(result, Config) and result.model_kind == "tiny_mlp" for result in together)


def test_a_jobs_loop_summary_is_kept_once_per_machine() -> None:
    def train(job: JobGroup) -> Guard:
        guard = Guard("tiny", Candidate(device="cpu", precision="fp32"), "digest", read_every=10, job=job)
        for _batch in guard.data(range(20)):
            guard.step(1.0)
        return guard

    guards = in_ranks(["0", "0"], train)
    assert all(isinstance(g, Guard) and g.summary().batches == 20 for g in guards)  # every rank timed its loop
    assert [s.batches for s in loops.of("digest", "tiny")] == [20]  # and the machine kept its first rank's


# -- the adapters for many processes --------------------------------------------------------------------------------


def _config(device: str, ranks: Ranks | None = None) -> Config:
    return Config(model_kind="tiny", device=device, precision="bf16-mixed", source="measured", reason="r",
                  fingerprint_digest="d", ranks=ranks)


@pytest.mark.parametrize(("config", "devices", "expected"), [
    pytest.param(_config("cpu", Ranks(rank=1, local_rank=1, world_size=2, local_world_size=2)), None,
                 {"accelerator": "cpu", "devices": 2, "strategy": "ddp"}, id="torchrun-one-machine"),
    pytest.param(_config("cuda:1", Ranks(rank=3, local_rank=1, world_size=4, local_world_size=2)), None,
                 {"accelerator": "cuda", "devices": 2, "num_nodes": 2, "strategy": "ddp"}, id="torchrun-two-machines"),
    pytest.param(_config("cpu"), 2, {"accelerator": "cpu", "devices": 2, "strategy": "ddp"},
                 id="lightnings-own-launcher"),
    pytest.param(_config("cuda:0"), 1, {"accelerator": "cuda", "devices": [0]}, id="one-process"),
])
def test_lightning_keywords_for_many_processes(config: Config, devices: int | None,
                                               expected: dict[str, object]) -> None:
    assert config.lightning_kwargs(devices=devices) == {**expected, "precision": "bf16-mixed"}


def test_lightning_keywords_refuse_what_lightning_cannot_run() -> None:
    with pytest.raises(FrameworkError, match="one MPS device"):
        _config("mps").lightning_kwargs(devices=2)
    with pytest.raises(ConfigurationError, match="devices=0 is invalid"):
        _config("cpu").lightning_kwargs(devices=0)


# -- a job's other processes, as copies of the timed step -----------------------------------------------------------


@pytest.mark.parametrize("processes", [1, 2])
def test_a_job_times_each_cpu_candidate_with_copies_of_its_step_running(
        processes: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from autotune._cache.freshness import family_key
    from autotune._calibrate import measure, new_worker

    steps = tmp_path / "steps"
    steps.mkdir()
    monkeypatch.setenv("RANKS_TEST_STEPS", str(steps))
    monkeypatch.setenv("AUTOTUNE_SEARCH", "precision")
    autotune.register_family("counted", "families_for_tests:build_counted")
    family = autotune.get_family("counted")
    default = default_threads()
    torch.set_num_threads(default + 1)  # the app's own count is not what it measures with; the conftest puts it back
    with new_worker() as worker:
        measured = measure(family, family_key(family), worker=worker, processes=processes, cores=4)
    assert all(r.usable for r in measured.candidates)
    # Each candidate ran with its process's share of 4 cores (alone, torch's default count, the worker's own).
    shares = {r.num_threads for r in measured.candidates}
    assert shares == ({2} if processes == 2 else {default})
    ran = {path.name for path in steps.iterdir()}
    assert len(ran) == processes  # the worker, and a copy beside it that ran the same steps


def test_a_job_of_two_processes_has_a_fingerprint_of_its_own() -> None:
    alone, two = autotune.fingerprint(), autotune.fingerprint(processes=2)
    assert alone == autotune.fingerprint(processes=1) and alone.processes == 1
    assert two.processes == 2 and two.environment["LOCAL_WORLD_SIZE"] == "2" and two.digest != alone.digest
