"""What a guard's replay costs: a training loop under the guard whose loss turns NaN in the run's precision only (not
in fp32) from a given step, so that the guard finds it and replays the batches it kept, in fp32 and in the run's
precision, as it would in an app. For the built-in transformer family and for a model of about 100M parameters (a
stack of Linear layers), each in a process of its own, so that the process's peak resident memory is the case's.

One JSON line per case: the model's and its optimizer's state in MiB (what a snapshot copies to the host), the
snapshot's own size, the run's ms per step, the replay's seconds, replayed steps and blame, and the process's
resident memory (current before the finding; peak before it and after the replay; from ``getrusage``'s high-water
mark, which counts tensors' memory that ``tracemalloc`` does not see), each set beside the state's size.

    python benchmarks/replay_cost.py [--device cpu] [--precision bf16-mixed] [--read-every N] [--quick]
"""

from __future__ import annotations

import argparse
import math
import os
import subprocess
import sys
import tempfile
import time
from typing import Any

import torch
import torch.nn.functional as F
from _common import emit
from torch import nn

import autotune
from autotune._families import get_family
from autotune.backends import backend_for

CASES = ("transformer", "linear_100m")


def peak_rss_bytes() -> int:
    """The process's resident memory high-water mark so far."""
    if sys.platform == "win32":
        import psutil

        return int(psutil.Process().memory_info().peak_wset)
    import resource

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)  # bytes on macOS, KiB elsewhere


def rss_bytes() -> int:
    import psutil

    return int(psutil.Process().memory_info().rss)


def _state_bytes(state: Any) -> int:
    if isinstance(state, torch.Tensor):
        return state.numel() * state.element_size()
    if isinstance(state, dict):
        return sum(_state_bytes(v) for v in state.values())
    if isinstance(state, (list, tuple)):
        return sum(_state_bytes(v) for v in state)
    return 0


def linear_stack(width: int, layers: int, batch: int, device: str) -> tuple[nn.Module, Any, Any]:
    """``layers`` Linear(width, width) with GELU between them (width 2048, 24 layers: 101M parameters), AdamW, a
    regression batch and its loss."""
    torch.manual_seed(0)
    blocks: list[nn.Module] = []
    for _ in range(layers):
        blocks += [nn.Linear(width, width), nn.GELU()]
    model = nn.Sequential(*blocks[:-1]).to(device)
    inputs = (torch.randn(batch, width, device=device), torch.randn(batch, width, device=device))

    def loss(model: nn.Module, inputs: Any) -> torch.Tensor:
        features, targets = inputs
        return F.mse_loss(model(features).float(), targets)

    return model, inputs, loss


def case(name: str, *, device: str, precision: str, quick: bool, read_every: int | None) -> None:
    """Train ``name`` under a guard until its forced finding is replayed; emit what it cost."""
    if name == "transformer":
        workload = get_family("transformer").build()
        model, loss = workload.model.to(device), workload.loss
        # --quick: two of the batch's rows (bf16's backward on a CPU without bf16 units takes seconds a step)
        inputs = tuple(t[:2 if quick else None].to(device) for t in workload.inputs)
    else:
        model, inputs, loss = linear_stack(256 if quick else 2048, 4 if quick else 24, 8, device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    read_every = read_every or (3 if quick else 50)
    fault_at = 2 * read_every - 2  # three NaN losses by the second read: found there

    def loss_fn(model: nn.Module, batch: Any) -> torch.Tensor:
        inputs, marked = batch
        value = loss(model, inputs)
        return value + float("nan") if marked and torch.is_autocast_enabled(torch.device(device).type) else value

    config = autotune.Config(model_kind=name, device=device, precision=precision, source="measured",
                             reason="benchmark", fingerprint_digest=autotune.fingerprint().digest)
    guard = autotune.Guard(name, config.candidate, config.fingerprint_digest, model=model, optimizer=optimizer,
                           loss_fn=loss_fn, read_every=read_every)
    scaler = config.grad_scaler()
    sync = backend_for(device).synchronize
    rss_before = peak_before = 0
    run_ms = replay_started = math.nan
    started = math.nan
    for step in range(1, 2 * read_every + 1):
        batch = (inputs, step >= fault_at)
        with config.autocast():
            value = loss_fn(model, batch)
        optimizer.zero_grad(set_to_none=True)
        scaler.scale(value).backward()
        scaler.step(optimizer)
        scaler.update()
        if step == 2 * read_every:  # the read that finds it: the replay runs inside this guard.step
            sync(device)
            run_ms = (time.perf_counter() - started) * 1000 / (step - 1)
            rss_before, peak_before = rss_bytes(), peak_rss_bytes()
            replay_started = time.perf_counter()
        guard.step(value, scaler, batch=batch)
        if step == 1:  # the first step warms up (allocator, kernel selection): the run's pace is from the second
            sync(device)
            started = time.perf_counter()
    replay_s = time.perf_counter() - replay_started
    peak_after = peak_rss_bytes()
    finding, tape = guard.finding, guard._tape
    assert finding is not None and finding.replay is not None and tape is not None and tape.snapshot is not None
    state = _state_bytes(model.state_dict()) + _state_bytes(optimizer.state_dict())
    snapshot = _state_bytes(tape.snapshot.model) + _state_bytes(tape.snapshot.optimizer)
    mib = 2**20
    emit({"benchmark": "replay_cost", "case": name, "device": device, "precision": precision, "quick": quick,
          "parameters": sum(p.numel() for p in model.parameters()), "state_mib": round(state / mib, 1),
          "snapshot_mib": round(snapshot / mib, 1), "snapshots": tape.taken, "run_ms_per_step": round(run_ms, 2),
          "replay_s": round(replay_s, 3), "replayed_steps": finding.replay.steps, "blame": finding.replay.blame,
          "replay_in_run_steps": round(replay_s * 1000 / run_ms, 1),
          "rss_before_finding_mib": round(rss_before / mib, 1),
          "peak_rss_before_finding_mib": round(peak_before / mib, 1),
          "peak_rss_after_replay_mib": round(peak_after / mib, 1),
          "replay_peak_growth_mib": round((peak_after - peak_before) / mib, 1),
          "replay_peak_growth_per_state": round((peak_after - peak_before) / state, 2),
          "peak_rss_per_state": round(peak_after / state, 2)})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--precision", default="bf16-mixed", choices=["bf16-mixed", "fp16-mixed"])
    parser.add_argument("--quick", action="store_true",
                        help="a small linear stack, two rows of the transformer's batch, a read every 3 steps")
    parser.add_argument("--read-every", type=int, help="steps between the guard's reads (default 50, --quick 3): a "
                        "replay covers up to two of them; fewer where bf16 steps on a CPU take seconds")
    parser.add_argument("--case", choices=CASES, help="run this case here (each case runs in a process of its own)")
    args = parser.parse_args()
    if args.case is not None:
        case(args.case, device=args.device, precision=args.precision, quick=args.quick, read_every=args.read_every)
        return
    with tempfile.TemporaryDirectory() as cache:  # the finding's demotion stays out of your cache
        env = {**os.environ, "AUTOTUNE_CACHE_DIR": cache}
        for name in CASES:
            argv = [sys.executable, __file__, "--case", name, "--device", args.device, "--precision", args.precision]
            argv += ["--quick"] if args.quick else []
            argv += ["--read-every", str(args.read_every)] if args.read_every else []
            subprocess.run(argv, env=env, check=True)


if __name__ == "__main__":
    main()
