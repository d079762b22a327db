"""Many processes of one job, started by the real launchers on loopback: torchrun (one machine of two processes, and
two simulated machines), Lightning DDP and ``accelerate launch``, each rank running tests/ranks_for_tests.py. Tiny
budgets, the precision search, a hard timeout on every process; the family is tests' ``slow_in``, whose precisions
compare as ``RANKS_TEST_SLOW`` says (a machine whose measurements differ from another's)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import torch.distributed as dist
from procs_for_tests import workers_of

from autotune._cache import demotions
from autotune._fingerprint import fingerprint
from autotune._variants import threads_per_process

TESTS = Path(__file__).parents[1]
SCRIPT = str(TESTS / "ranks_for_tests.py")
#: how long a launched job may take here at most (a busy 2-core machine starts 5 interpreters that import torch)
JOB_TIMEOUT_S = 420


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def job_env(tmp_path: Path, name: str = "cache", **extra: str) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if not key.startswith(("AUTOTUNE_", "RANKS_TEST_"))}
    root = str(TESTS.parent)
    env.update(PYTHONPATH=os.pathsep.join([root, env.get("PYTHONPATH", "")]), AUTOTUNE_CACHE_DIR=str(tmp_path / name),
               AUTOTUNE_BUDGET_S="0.3", AUTOTUNE_SEARCH="precision", RANKS_TEST_SLOW="fp32",
               RANKS_TEST_DIR=str(tmp_path),
               # One thread a process, as torchrun sets it: on a busy machine two threads' barriers make a tiny
               # step's time swing several-fold.
               OMP_NUM_THREADS="1")
    return {**env, **extra}


def results(out: str) -> list[dict[str, object]]:
    return [json.loads(line.removeprefix("RESULT ")) for line in out.splitlines() if line.startswith("RESULT ")]


def by_rank(found: Sequence[dict[str, object]], key: str | None = None) -> dict[int, dict[str, object]]:
    """The first result of each rank that has ``key`` (any result without a key)."""
    picked: dict[int, dict[str, object]] = {}
    for result in found:
        if key is None or key in result:
            picked.setdefault(int(str(result["rank"])), result)
    return picked


def run(argv: list[str], env: dict[str, str]) -> tuple[str, str]:
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=JOB_TIMEOUT_S)
    assert done.returncode == 0, done.stderr[-4000:]
    return done.stdout, done.stderr


def test_torchrun_two_processes_one_calibration_one_answer_then_lightning_ddp_with_the_guard(tmp_path: Path) -> None:
    out, err = run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr",
                    "127.0.0.1", "--master-port", str(free_port()), SCRIPT, "lightning"], job_env(tmp_path))
    found = results(out)
    answers, fits, again = by_rank(found, "digest"), by_rank(found, "trainer"), by_rank(found, "again")
    assert sorted(answers) == sorted(fits) == sorted(again) == [0, 1]
    # One calibration for the machine: its first rank measured, the other waited.
    assert err.count("calibrating slow_in on this machine") == 1
    # One answer: fp32 is 20 ms slower per step on this "machine", so bf16 wins; each rank's threads for two.
    assert answers[0]["digest"] == answers[1]["digest"] and answers[0]["precision"] == "bf16-mixed"
    share = threads_per_process(fingerprint().usable_cores, 2)
    for rank, answer in answers.items():
        assert answer["ranks"] == {"rank": rank, "local_rank": rank, "world_size": 2, "local_world_size": 2}
        assert answer["threads"] == answer["torch_threads"] == share and answer["device"] == "cpu"
    # Lightning trained DDP with the Config's keywords; rank 1's NaN losses were the job's finding.
    for fit in fits.values():
        assert fit["trainer"] == {"accelerator": "cpu", "devices": "2", "strategy": "ddp", "precision": "bf16-mixed"}
        assert fit["world_size"] == 2 and fit["warned"] == 1 and fit["step"] == 11
        assert str(fit["finding"]).startswith("3 non-finite losses") and str(fit["finding"]).endswith(", on rank 1")
        assert fit["replay"]["blame"] == "configuration", fit["replay"]  # type: ignore[index]
    # One demotion, recorded by the machine's first rank (the test's cache directory is the job's).
    assert len(demotions.of(str(answers[0]["fingerprint"]), "slow_in")) == 1
    # Asked again together, the job agrees on the best candidate left.
    after = {rank: result["again"] for rank, result in again.items()}
    assert isinstance(after[0], dict) and isinstance(after[1], dict)
    assert after[0]["digest"] == after[1]["digest"] and after[0]["precision"] != "bf16-mixed"
    assert str(after[1]["reason"]).startswith("bf16-mixed was demoted after NaN losses at step 11")


def test_torchrun_ddp_a_finding_on_one_rank_is_replayed_there_alone_and_demoted_once(tmp_path: Path) -> None:
    # The replay trains a copy on the finding rank only: a copy of the DDP wrapper would wait in its all-reduce for
    # ranks that never join (each rank's gloo timeout is 30 s, then the job fails).
    out, _ = run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr",
                  "127.0.0.1", "--master-port", str(free_port()), SCRIPT, "ddp"], job_env(tmp_path))
    found = results(out)
    answers, trained = by_rank(found, "digest"), by_rank(found, "ddp")
    assert sorted(trained) == [0, 1] and answers[0]["precision"] == "bf16-mixed"
    for run_ in trained.values():
        assert run_["warned"] == 1 and str(run_["finding"]).endswith(", on rank 1")
        assert run_["replay"]["blame"] == "configuration", run_["replay"]  # type: ignore[index]
    assert len(demotions.of(str(answers[0]["fingerprint"]), "slow_in")) == 1


def test_torchrun_a_syncbatchnorm_model_replays_on_one_rank_joining_no_collective(tmp_path: Path) -> None:
    # Rank 1 replays alone while rank 0 waits at a barrier: the copy's SyncBatchNorm normalizes its local batch.
    out, _ = run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr",
                  "127.0.0.1", "--master-port", str(free_port()), SCRIPT, "syncbn"], job_env(tmp_path))
    replayed = by_rank(results(out), "syncbn")
    assert sorted(replayed) == [0, 1] and replayed[0]["replay"] is None
    # the run's own SyncBatchNorm cannot run on the CPU in a group of two: what the replay's copy must not do
    assert "SyncBatchNorm expected input tensor to be on GPU" in str(replayed[1]["refused"])
    replay = replayed[1]["replay"]
    assert isinstance(replay, dict) and replay["blame"] == "configuration", replay
    assert (replay["from_step"], replay["steps"], replay["run_at"]) == (1, 19, 9)


def test_torchrun_fsdp_a_finding_says_once_it_cannot_replay_and_demotes_nothing(tmp_path: Path) -> None:
    # FSDP's fully_shard (FSDP1 wants an accelerator): no rank holds the whole state, so nothing is kept or replayed.
    out, err = run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr",
                    "127.0.0.1", "--master-port", str(free_port()), SCRIPT, "fsdp"], job_env(tmp_path))
    found = results(out)
    answers, trained = by_rank(found, "digest"), by_rank(found, "fsdp")
    assert sorted(trained) == [0, 1] and answers[0]["precision"] == "bf16-mixed"
    for run_ in trained.values():
        assert run_["fsdp"] == "FSDPSequential" and run_["warned"] == 1
        assert str(run_["finding"]).endswith(", on rank 1")
        assert run_["replay"] == {"blame": "unreplayed", "detail": "the model is sharded across the ranks "
                                  "(FSDPSequential): none can replay alone", "from_step": None, "steps": None,
                                  "since": None, "reference": None, "reference_at": None, "run_at": None}
    assert err.count("keeps no state to replay from") == 2  # once on each rank
    assert demotions.of(str(answers[0]["fingerprint"]), "slow_in") == []


def test_a_rank_killed_mid_calibration_leaves_the_other_a_clear_error_within_the_timeout(tmp_path: Path) -> None:
    # A launcher that does not watch its ranks (ranks started by hand on each machine, a batch system's steps):
    # this test hosts the store, as torchrun's agent does, and kills rank 0 while its worker measures.
    port = free_port()
    store = dist.TCPStore("127.0.0.1", port, 2, is_master=True, wait_for_workers=False)
    timeout_s = 60
    ranks = []
    for rank in range(2):
        env = job_env(tmp_path, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2", LOCAL_WORLD_SIZE="2",
                      GROUP_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                      TORCHELASTIC_USE_AGENT_STORE="True", AUTOTUNE_RANKS_TIMEOUT_S=str(timeout_s))
        ranks.append(subprocess.Popen([sys.executable, SCRIPT, "answer"], env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))
    try:
        deadline = time.monotonic() + JOB_TIMEOUT_S
        while not workers_of(ranks[0].pid):
            assert time.monotonic() < deadline and ranks[0].poll() is None and ranks[1].poll() is None
            time.sleep(0.2)
        ranks[0].send_signal(signal.SIGKILL)
        killed = time.monotonic()
        _, err = ranks[1].communicate(timeout=timeout_s + 60)  # a hang fails here
        assert ranks[1].returncode != 0 and time.monotonic() - killed < timeout_s + 60
        assert "autotune._errors.RanksError: the ranks of this job could not agree on 'slow_in': rank 1 waited for " \
               "rank 0's machine to measure 'slow_in' (at most AUTOTUNE_RANKS_TIMEOUT_S=60 s) and got: " in err
    finally:
        for process in ranks:
            if process.poll() is None:
                process.kill()
            process.communicate()
        del store


def test_ranks_that_ask_for_other_families_raise_on_every_rank_naming_both(tmp_path: Path) -> None:
    out, err = run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr",
                    "127.0.0.1", "--master-port", str(free_port()), SCRIPT, "kinds"], job_env(tmp_path))
    errors = by_rank(results(out), "error")
    assert sorted(errors) == [0, 1], err[-4000:]
    for error in errors.values():
        assert "rank 1 asked for 'mlp' but rank 0 for 'tiny_mlp'" in str(error["error"])
    assert "calibrating" not in err  # before anything was measured


def test_two_machines_with_other_fingerprints_agree_on_rank_0s_choice_and_say_so(tmp_path: Path) -> None:
    # Two torchrun agents on localhost are two machines: each its own cache, one with MKL_NUM_THREADS set (another
    # fingerprint), and precisions that compare the other way round (machine B: bf16 is the slow one).
    port = free_port()
    machines = {"A": {"RANKS_TEST_SLOW": "fp32"}, "B": {"RANKS_TEST_SLOW": "mixed", "MKL_NUM_THREADS": "1"}}
    agents = [subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend",
         "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "ranks-test", SCRIPT, "answer"],
        env=job_env(tmp_path, name, RANKS_TEST_MACHINE=name, **settings), stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True) for name, settings in machines.items()]
    outputs = []
    try:
        for agent in agents:
            out, err = agent.communicate(timeout=JOB_TIMEOUT_S)
            assert agent.returncode == 0, err[-4000:]
            outputs.append(out)
    finally:
        for agent in agents:
            if agent.poll() is None:
                agent.kill()
                agent.communicate()
    answers = by_rank([r for out in outputs for r in results(out)], "digest")
    first, second = answers[0], answers[1]
    assert first["fingerprint"] != second["fingerprint"] and first["digest"] == second["digest"]
    # Rank 0's machine chose (whichever agent the rendezvous made machine 0) what its own measurements say.
    assert first["precision"] == ("bf16-mixed" if first["machine"] == "A" else "fp32") == second["precision"]
    assert first["own"] is None and second["own"] is not None
    assert "the job's choice (rank 0's machine measured it); here" in str(second["reason"])
    assert "slower" in str(second["reason"])


def test_accelerate_launch_trains_every_rank_with_the_jobs_answer_and_the_guard(tmp_path: Path) -> None:
    # `accelerate launch --num_processes 2 --cpu` starts one process (multi-CPU there takes mpirun); --multi_gpu
    # starts torchrun's two, which Accelerator(cpu=True) trains on the CPU over gloo.
    out, err = run(["accelerate", "launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1",
                    "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", str(free_port()),
                    SCRIPT, "accelerate"], job_env(tmp_path))
    found = results(out)
    answers, steps = by_rank(found, "digest"), by_rank(found, "processes")
    assert sorted(answers) == sorted(steps) == [0, 1]
    assert err.count("calibrating slow_in on this machine") == 1
    assert answers[0]["digest"] == answers[1]["digest"]
    for trained in steps.values():
        assert trained["processes"] == 2 and trained["distributed"] == "DistributedType.MULTI_CPU"
        assert str(trained["accelerator_device"]).startswith("cpu")
        assert trained["finding"] is None and trained["steps"] == 30


def test_lightnings_own_launcher_compares_the_answers_when_the_fit_sets_up_and_guards_the_job(tmp_path: Path) -> None:
    # The first process answers alone before fit starts the second, which answers alone too, from the same cache.
    out, err = run([sys.executable, SCRIPT, "lightning-own"], job_env(tmp_path, MASTER_PORT=str(free_port())))
    found = results(out)
    answers, fits = by_rank(found, "digest"), by_rank(found, "trainer")
    assert sorted(fits) == [0, 1] and err.count("calibrating slow_in on this machine") == 1
    assert {a["digest"] for a in answers.values()} == {answers[0]["digest"]} and answers[0]["ranks"] is None
    for fit in fits.values():
        assert fit["trainer"] == {"accelerator": "cpu", "devices": "2", "strategy": "ddp", "precision": "bf16-mixed"}
        assert fit["job"] and fit["world_size"] == 2 and fit["warned"] == 1
        assert str(fit["finding"]).endswith(", on rank 1")
    assert len(demotions.of(str(answers[0]["fingerprint"]), "slow_in")) == 1


def test_a_process_outside_any_job_answers_alone(tmp_path: Path) -> None:
    env = job_env(tmp_path, RANK="0")  # a stray variable is no launch
    out, _ = run([sys.executable, SCRIPT, "answer"], env)
    (alone,) = results(out)
    assert alone["ranks"] is None and alone["threads"] is None
