"""Many processes of one job, in this process: a job's other processes on a machine, as copies of the timed step."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import autotune

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
    with new_worker() as worker:
        measured = measure(family, family_key(family), worker=worker, processes=processes, cores=4)
    assert all(r.usable for r in measured.candidates)
    # Each candidate ran with its process's share of 4 cores (the worker's own count when it is alone).
    shares = {r.num_threads for r in measured.candidates}
    assert shares == ({2} if processes == 2 else {torch.get_num_threads()})
    ran = {path.name for path in steps.iterdir()}
    assert len(ran) == processes  # the worker, and a copy beside it that ran the same steps


def test_a_job_of_two_processes_has_a_fingerprint_of_its_own() -> None:
    alone, two = autotune.fingerprint(), autotune.fingerprint(processes=2)
    assert alone == autotune.fingerprint(processes=1) and alone.processes == 1
    assert two.processes == 2 and two.environment["LOCAL_WORLD_SIZE"] == "2" and two.digest != alone.digest
