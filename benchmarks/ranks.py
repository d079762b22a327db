"""CPU threads per rank in a job of many processes on one machine, as samples per second of the whole job: the
count autotune measured for them (each CPU candidate timed with as many copies of its step running as the job has
processes here) against torchrun's default (1 thread: it sets OMP_NUM_THREADS=1) and against every usable core in
every rank (each process's default when alone), side by side in one run.

Each arm is one torchrun job of ``--processes`` ranks training ``--kind`` with DDP (gloo) for ``--seconds`` after a
warm-up; every arm trains autotune's answer (precision, layout, optimizer) and only the thread count differs. The
arms alternate over ``--rounds``; the first job's best_config calibrates once (not counted). One JSON line per job,
then one per arm (median samples/s) with its ratio to autotune's. Run it on a quiet machine.

    python benchmarks/ranks.py [--kind cnn] [--processes 2] [--seconds 10] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time

from _common import emit

ARMS = ("autotune", "torchrun-default", "all-threads")


def _cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def rank_job(arm: str, kind: str, seconds: float) -> None:
    """One rank of one arm's job: train, and on rank 0 print the job's samples/s."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    import autotune
    from autotune._families import get_family

    config = autotune.best_config(kind)  # the job's answer: every rank agrees, its thread count measured for them
    threads = {"autotune": config.num_threads or torch.get_num_threads(), "torchrun-default": 1,
               "all-threads": _cores()}[arm]
    torch.set_num_threads(threads)
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    workload = get_family(kind).build()
    model, optimizer = config.prepare(workload.model, workload.optimizer)
    ddp = DistributedDataParallel(model)
    inputs = config.prepare_batch(workload.inputs)
    scaler = config.grad_scaler()

    def steps(count: int) -> float:
        started = time.perf_counter()
        for _ in range(count):
            with config.autocast():
                loss = workload.loss(ddp, inputs)
            optimizer.zero_grad(set_to_none=True)
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
        return time.perf_counter() - started

    steps(3)  # the first steps pay the allocator's and autograd's start
    warm_s = steps(5) / 5
    # Every rank runs the same number of steps (DDP's all-reduce pairs them): the slowest rank's estimate decides.
    count = torch.tensor([max(10, int(seconds / max(warm_s, 1e-6)))])
    dist.all_reduce(count, op=dist.ReduceOp.MIN)
    dist.barrier()
    elapsed = torch.tensor([steps(int(count))])
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
    if dist.get_rank() == 0:
        samples = int(count) * inputs[0].shape[0] * dist.get_world_size()
        print("JOB " + json.dumps({"arm": arm, "threads_per_rank": threads, "steps": int(count),
                                   "samples_per_s": samples / float(elapsed), "config": config.candidate.label}),
              flush=True)
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kind", default="cnn")
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--rank-job", choices=ARMS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rank_job is not None:
        rank_job(args.rank_job, args.kind, args.seconds)
        return
    rates: dict[str, list[float]] = {arm: [] for arm in ARMS}
    for round_index in range(args.rounds):
        order = ARMS if round_index % 2 == 0 else tuple(reversed(ARMS))
        for arm in order:
            done = subprocess.run(
                [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(args.processes),
                 "--master-addr", "127.0.0.1", "--master-port", str(_free_port()), __file__, "--rank-job", arm,
                 "--kind", args.kind, "--seconds", str(args.seconds)],
                capture_output=True, text=True, timeout=1800, check=False)
            line = next((line for line in done.stdout.splitlines() if line.startswith("JOB ")), None)
            if line is None:
                raise SystemExit(f"the {arm} job failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
            job = json.loads(line.removeprefix("JOB "))
            rates[arm].append(job["samples_per_s"])
            emit({"kind": args.kind, "processes": args.processes, "cores": _cores(), "round": round_index, **job})
    autotune_rate = statistics.median(rates["autotune"])
    for arm in ARMS:
        rate = statistics.median(rates[arm])
        emit({"kind": args.kind, "processes": args.processes, "cores": _cores(), "arm": arm, "jobs": len(rates[arm]),
              "median_samples_per_s": rate, "vs_autotune": rate / autotune_rate})


if __name__ == "__main__":
    main()
