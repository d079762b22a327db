"""Many processes of one job, in this process: where a launcher puts a rank, each rank's own device, and the job's
one answer on recorded machines (measured by the real search on a fake clock, decided by the real decision code),
exchanged over a real gloo group between threads on loopback. The launchers themselves: test_ranks_launch.py."""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import threading
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch._C._distributed_c10d import AllgatherOptions

import autotune
from autotune import CalibrationError, Config, ConfigMisbehaved, ConfigurationError, FrameworkError, RanksError
from autotune._cache import demotions, loops
from autotune._cache.store import StoreFile
from autotune._decide import decide
from autotune._decision import Decision
from autotune._fingerprint import default_threads
from autotune._guard.watch import Guard
from autotune._ranks.agree import device_counts, digest, for_rank, own_device, view, words
from autotune._ranks.group import JobGroup
from autotune._ranks.job import Machine, agreed, confirm
from autotune._ranks.launch import Launch, from_environment, own_index
from autotune._records import Candidate, FamilyResult, Ranks
from autotune.testing.simulate import simulate
from autotune.testing.truth import truth_from_record

MACHINES = Path(__file__).parent.parent / "fixtures" / "machines"
TORCHRUN = {"RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": "1"}


# -- where a launcher puts a rank ---------------------------------------------------------------------------------


def test_torchruns_variables_place_the_process() -> None:
    assert from_environment(TORCHRUN) == Launch(rank=3, world_size=4, local_rank=1, node="1")
    assert from_environment({**TORCHRUN, "GROUP_RANK": "", "NODE_RANK": "0"}) == Launch(
        rank=3, world_size=4, local_rank=1, node="0")


@pytest.mark.parametrize("environ", [
    pytest.param({}, id="no-launcher"),
    pytest.param({k: v for k, v in TORCHRUN.items() if k != "LOCAL_WORLD_SIZE"}, id="lightnings-own-children"),
    pytest.param({**TORCHRUN, "RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1"}, id="a-world-of-one"),
])
def test_without_a_job_a_process_answers_alone(environ: dict[str, str]) -> None:
    assert from_environment(environ) is None


def test_a_rank_beyond_the_world_is_an_error_naming_the_variable() -> None:
    with pytest.raises(ConfigurationError, match="RANK=.*a rank below WORLD_SIZE=4"):
        from_environment({**TORCHRUN, "RANK": "4"})
    with pytest.raises(ConfigurationError, match="LOCAL_RANK='one'"):
        from_environment({**TORCHRUN, "LOCAL_RANK": "one"})


@pytest.mark.parametrize(("device", "local_rank", "counts", "expected"), [
    pytest.param("cuda:0", 1, {"cuda": 2}, "cuda:1", id="second-gpu-of-two"),
    pytest.param("cuda:0", 3, {"cuda": 2}, "cuda:1", id="four-ranks-share-two-gpus"),
    pytest.param("cuda:0", 1, {"cuda": 1}, "cuda:0", id="each-rank-sees-only-its-own"),
    pytest.param("xpu:0", 2, {"xpu": 4}, "xpu:2", id="xpu"),
    pytest.param("mps", 1, {"mps": 1}, "mps", id="mps-as-it-is"),
    pytest.param("cpu", 1, {"cuda": 2}, "cpu", id="cpu-as-it-is"),
])
def test_each_rank_trains_on_its_own_device(device: str, local_rank: int, counts: dict[str, int],
                                            expected: str) -> None:
    assert own_device(device, local_rank, counts) == expected
    assert own_index(local_rank, 0) == 0


# -- recorded machines, a job of ranks in threads -------------------------------------------------------------------


def _stored(name: str) -> StoreFile:
    return StoreFile.model_validate_json((MACHINES / f"{name}.json").read_bytes())


def _measured(name: str, kind: str, *, gpus: int = 1) -> FamilyResult:
    """A recorded machine's family measured by the real search; ``gpus=2``: the machine with a second, identical
    GPU (its truth is the first one's)."""
    truth = truth_from_record(_stored(name).families[kind], default_threads=8)
    if gpus == 2:
        def second(table: dict[Candidate, object]) -> dict[Candidate, object]:
            return {**table, **{c.model_copy(update={"device": "cuda:1"}): v for c, v in table.items()
                                if c.device == "cuda:0"}}
        truth = dataclasses.replace(truth, candidates=second(dict(truth.candidates)),  # type: ignore[arg-type]
                                    candidate_variant_factors=second(dict(truth.candidate_variant_factors)))
    return simulate(truth, seed=0)[0]


def _machine(name: str, kind: str, *, gpus: int = 1, share: int = 4) -> Callable[[JobGroup], Machine]:
    """What a machine's first rank finds (as ``_answer`` does, from a recorded machine): each local rank's answer on
    its own view of the measurements."""
    stored = _stored(name)
    measured = _measured(name, kind, gpus=gpus)
    counts = device_counts(stored.fingerprint.accelerators * gpus)

    def machine(job: JobGroup) -> Machine:
        own = {m.local_rank: decide(view(measured, m.local_rank, counts), digest=stored.fingerprint.digest)
               for m in job.machine}
        return Machine(own=own, measured=measured, counts=counts, share=share)

    return machine


def in_ranks(nodes: Sequence[str], act: Callable[[JobGroup], object], *, timeout_s: float = 60.0,
             loop_timeout_s: float = 30.0) -> list[object]:
    """``act`` on each rank of a job whose rank ``i`` runs on machine ``nodes[i]``, one thread per rank, over a real
    gloo group on loopback: what each returned, or the exception it raised."""
    store = dist.HashStore()
    results: list[object] = [None] * len(nodes)

    def rank(index: int) -> None:
        launch = Launch(rank=index, world_size=len(nodes), local_rank=list(nodes[:index]).count(nodes[index]),
                        node=nodes[index])
        try:
            group = dist.ProcessGroupGloo(dist.PrefixStore("job/", store), index, len(nodes),
                                          dt.timedelta(seconds=timeout_s))
            results[index] = act(JobGroup(launch, group, timeout_s, loop_timeout_s=loop_timeout_s))
        except Exception as exc:
            results[index] = exc

    threads = [threading.Thread(target=rank, args=(index,)) for index in range(len(nodes))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=4 * timeout_s)
    assert not any(thread.is_alive() for thread in threads)
    return results


def test_on_a_two_gpu_machine_rank_1_trains_on_cuda_1_with_rank_0s_settings() -> None:
    machine = _machine("rtx-3090-i9", "cnn", gpus=2)
    first, second = in_ranks(["0", "0"], lambda job: agreed(job, "cnn", {}, machine))
    assert isinstance(first, Decision) and isinstance(second, Decision)
    assert (first.device, second.device) == ("cuda:0", "cuda:1")
    assert digest(first) == digest(second)
    assert words(second) == "cuda bf16-mixed channels_last fused-optimizer"
    assert "on cuda:1" in second.reason and "cuda:0" not in second.reason
    assert second.ranks == Ranks(rank=1, local_rank=1, world_size=2, local_world_size=2)
    assert second.evidence is not None and second.evidence.agreement is not None
    assert second.evidence.agreement.decided_by == 0


def test_two_machines_that_disagree_train_with_rank_0s_choice_and_say_what_it_costs_the_other() -> None:
    # An RTX 3090 (native bf16) and an RTX 2070 (emulated bf16: fp16 measured fastest there).
    machines = {"0": _machine("rtx-3090-i9", "cnn"), "1": _machine("rtx-2070", "cnn")}
    first, second = in_ranks(["0", "1"], lambda job: agreed(job, "cnn", {}, machines[job.launch.node or ""]))
    assert isinstance(first, Decision) and isinstance(second, Decision)
    assert digest(first) == digest(second) and (first.precision, second.precision) == ("bf16-mixed", "bf16-mixed")
    assert first.reason.startswith("bf16 mixed precision with channels_last and the fused optimizer on cuda:0: ")
    assert second.device == "cuda:0" and second.fingerprint_digest == _stored("rtx-2070").fingerprint.digest
    agreement = second.evidence.agreement if second.evidence is not None else None
    assert agreement is not None and agreement.own is not None and agreement.own.precision == "fp16-mixed"
    assert agreement.cost is not None and agreement.cost > 1
    assert "the job's choice (rank 0's machine measured it); here" in second.reason
    assert f"{agreement.cost:.1f}x slower" in second.reason
    assert first.evidence is not None and first.evidence.agreement is not None
    assert first.evidence.agreement.own is None  # rank 0's machine chose


def test_a_cpu_answer_carries_its_thread_count_in_a_job() -> None:
    measured = _measured("apple-m1", "tiny_mlp")
    own = decide(measured, digest="d")
    assert own.device == "cpu" and own.num_threads is None
    ranks = Ranks(rank=1, local_rank=1, world_size=2, local_world_size=2)
    config = for_rank(own, own, measured, ranks=ranks, decided_by=0, counts={"mps": 1}, share=3)
    assert config.num_threads == 3 and digest(config) == digest(own)
    gpu = decide(measured, prefer="gpu", digest="d")
    assert for_rank(gpu, gpu, measured, ranks=ranks, decided_by=0, counts={"mps": 1}, share=3).num_threads is None


def test_a_machine_that_cannot_answer_makes_every_rank_raise() -> None:
    def failing(job: JobGroup) -> Machine:
        raise CalibrationError("cnn", [("cpu fp32", "error: the reference diverged")])

    machines = {"0": _machine("rtx-3090-i9", "cnn"), "1": failing}
    first, second = in_ranks(["0", "1"], lambda job: agreed(job, "cnn", {}, machines[job.launch.node or ""]))
    assert isinstance(second, CalibrationError)
    assert isinstance(first, RanksError)
    assert "rank 1's machine could not answer: CalibrationError" in str(first)


def test_a_rank_that_does_not_come_leaves_the_others_an_error_within_the_timeout() -> None:
    machine = _machine("rtx-3090-i9", "cnn")

    def act(job: JobGroup) -> object:
        if job.launch.rank == 1:
            time.sleep(6)  # alive, its group open, never asking: a rank stuck elsewhere
            return None
        return agreed(job, "cnn", {}, machine)

    first, _ = in_ranks(["0", "1"], act, timeout_s=2.0)
    assert isinstance(first, RanksError)
    assert "rank 0 waited for the other ranks to ask for 'cnn' too (at most AUTOTUNE_RANKS_TIMEOUT_S=2 s) " \
        "and got: Timed out" in str(first)


def test_ranks_that_ask_for_other_families_or_options_raise_on_every_rank_naming_both() -> None:
    machine = _machine("rtx-3090-i9", "cnn")

    def asking(kinds: Sequence[str], options: Sequence[dict[str, object]]) -> list[object]:
        def act(job: JobGroup) -> object:  # the recorded machine measured 'cnn': what is measured for the job
            rank = job.launch.rank
            return agreed(job, kinds[rank], options[rank], machine)

        return in_ranks(["0", "0"], act)

    auto: dict[str, object] = {"prefer": "auto", "model": None}
    for result in asking(["tiny_mlp", "mlp"], [auto, auto]):
        assert isinstance(result, RanksError)
        assert "rank 1 asked for 'mlp' but rank 0 for 'tiny_mlp'" in str(result)
    for result in asking(["cnn", "cnn"], [auto, {"prefer": "cpu", "model": "Sequential 5c3e2a09d1f4"}]):
        assert isinstance(result, RanksError)
        assert "rank 1 asked for 'cnn' with prefer='cpu', model='Sequential 5c3e2a09d1f4' but rank 0 with " \
            "prefer='auto', model=None" in str(result)
    assert all(isinstance(result, Decision) for result in asking(["cnn", "cnn"], [auto, dict(auto)]))


def test_ranks_at_other_exchanges_raise_naming_both_and_an_older_autotune_is_named() -> None:
    def act(job: JobGroup) -> object:
        return job.allgather("{}", at="best_config" if job.launch.rank == 0 else "the answers for 'cnn'",
                             waiting_for="the others")

    for result in in_ranks(["0", "0"], act):
        assert isinstance(result, RanksError)
        assert "was at the answers for 'cnn' while rank 0 was at best_config" in str(result) \
            or "rank 0 was at best_config while rank 1 was at the answers for 'cnn'" in str(result)

    def older(job: JobGroup) -> object:
        if job.launch.rank == 0:
            return job.allgather("{}", at="best_config", waiting_for="the others")
        # an older autotune's allgather: the lengths, then the payloads padded to the longest, without a name
        data = torch.tensor(list(b"{}"), dtype=torch.uint8)
        lengths = [torch.empty(1, dtype=torch.int64) for _ in range(2)]
        job.group.allgather([lengths], [torch.tensor([len(data)])], AllgatherOptions()).wait()
        padded = [torch.empty(int(max(lengths)), dtype=torch.uint8) for _ in range(2)]
        job.group.allgather([padded], [torch.cat([data, torch.zeros(len(padded[0]) - len(data), dtype=torch.uint8)])],
                            AllgatherOptions()).wait()
        return None

    first, _ = in_ranks(["0", "0"], older)
    assert isinstance(first, RanksError)
    assert "rank 1 runs an autotune that does not name its exchanges (an older one than rank 0's" in str(first)


def test_configs_that_differ_raise_on_every_rank_naming_both() -> None:
    configs = [Config(model_kind="tiny", device="cpu", precision=p, source="measured", reason="r",  # type: ignore[arg-type]
                      fingerprint_digest="d") for p in ("bf16-mixed", "fp32")]
    results = in_ranks(["0", "0"], lambda job: confirm(job, configs[job.launch.rank]))
    for result in results:
        assert isinstance(result, RanksError)
        assert "rank 1 would train with 'cpu fp32' but rank 0 with 'cpu bf16-mixed'" in str(result)
    same = in_ranks(["0", "1"], lambda job: confirm(job, configs[0]))
    assert same == [None, None]


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
