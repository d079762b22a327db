"""What the training loop's guard costs: the built-in cnn and transformer training loops with and without
``guard.step(loss, scaler, batch=inputs)`` (a guard that watches the model and can replay), side by side in one
process.

Each round times a block of steps of each loop (the order alternating from round to round), synchronising only at
the end of a block, as a training loop does; the overhead is the paired ratio of ms per step, guarded over plain,
with its 95% interval (the state copies to the host included: how many were taken, and the last one's ms). A second
figure times ``guard.step`` alone (reads included) over many calls: its cost over the plain step time is the
overhead it implies, with far less noise than the loops' ratio. Last, what a finding costs: the replay of the
batches kept since the last state copy, in fp32 and in the run's precision, in ms and in plain steps.

    python benchmarks/guard_overhead.py [--rounds N] [--steps N] [--device cpu] [--precision fp32]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import torch
from _common import emit

import autotune
from autotune import _stats
from autotune._families import get_family
from autotune.backends import backend_for

KINDS = ("cnn", "transformer")


class Loop:
    """One built-in family's training step on ``config``, with its own model, optimizer and GradScaler."""

    def __init__(self, kind: str, config: autotune.Config) -> None:
        torch.manual_seed(0)
        workload = get_family(kind).build()
        self.config = config
        self.model, self.optimizer = config.prepare(workload.model, workload.optimizer)
        self.inputs = config.prepare_batch(workload.inputs)
        self.loss = workload.loss
        self.scaler = config.grad_scaler()
        self.sync = backend_for(config.device).synchronize

    def guard(self) -> autotune.Guard:
        """A guard that watches this loop's model and optimizer, as an app that wants replays makes it."""
        return self.config.guard(self.model, self.optimizer, loss_fn=self.loss)

    def block(self, steps: int, guard: autotune.Guard | None) -> float:
        """ms per step over ``steps`` steps, synchronised once at the end."""
        started = time.perf_counter()
        for _ in range(steps):
            with self.config.autocast():
                loss = self.loss(self.model, self.inputs)
            self.optimizer.zero_grad(set_to_none=True)
            self.scaler.scale(loss).backward()
            self.scaler.step(self.optimizer)
            self.scaler.update()
            if guard is not None:
                guard.step(loss, self.scaler, batch=self.inputs)
        self.sync(self.config.device)
        return (time.perf_counter() - started) * 1000 / steps


def guard_step_us(loop: Loop, calls: int = 20_000) -> float:
    """µs per ``guard.step`` on a device scalar loss and the loop's batch, its reads every 50 steps and its state
    copies included."""
    guard = loop.guard()
    loss = torch.ones((), device=loop.config.device)
    sync = backend_for(loop.config.device).synchronize
    started = time.perf_counter()
    for _ in range(calls):
        guard.step(loss, loop.scaler, batch=loop.inputs)
    sync(loop.config.device)
    return (time.perf_counter() - started) * 1e6 / calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30, help="enough that the guarded loop reads its buffer")
    parser.add_argument("--steps", type=int, default=4, help="steps per block")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--precision", default="fp32", choices=["fp32", "tf32", "bf16-mixed", "fp16-mixed"])
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as cache:  # a healthy run writes nothing; a finding would stay out of yours
        os.environ["AUTOTUNE_CACHE_DIR"] = cache
        for kind in KINDS:
            config = autotune.Config(model_kind=kind, device=args.device, precision=args.precision,
                                     source="measured", reason="benchmark",
                                     fingerprint_digest=autotune.fingerprint().digest)
            plain_loop, guarded_loop = Loop(kind, config), Loop(kind, config)
            guard = guarded_loop.guard()
            for loop in (plain_loop, guarded_loop):
                loop.block(3, None)  # warm-up: allocator, kernel selection
            plain, guarded = [], []
            for index in range(args.rounds):
                if index % 2 == 0:
                    plain.append(plain_loop.block(args.steps, None))
                    guarded.append(guarded_loop.block(args.steps, guard))
                else:
                    guarded.append(guarded_loop.block(args.steps, guard))
                    plain.append(plain_loop.block(args.steps, None))
            ratio, low, high = _stats.ratio_interval(guarded, plain, alpha=0.025)
            step_us = guard_step_us(guarded_loop)
            plain_ms = _stats.median(plain)
            tape = guard._tape  # what the guard keeps to replay: its state copies, and the replay of a finding
            assert tape is not None and tape.snapshot is not None
            started = time.perf_counter()
            replay = tape.replay(config.candidate, "non_finite", guard.steps, step_ms=None)  # unbounded: timed in full
            replay_ms = (time.perf_counter() - started) * 1000
            emit({"benchmark": "guard_overhead", "kind": kind, "device": args.device, "precision": args.precision,
                  "rounds": args.rounds, "steps_per_round": args.steps, "plain_ms": round(plain_ms, 3),
                  "guarded_ms": round(_stats.median(guarded), 3), "ratio": round(ratio, 4),
                  "interval": [round(low, 4), round(high, 4)], "guard_step_us": round(step_us, 2),
                  "implied_overhead": round(step_us / 1000 / plain_ms, 6), "findings": guard.finding is not None,
                  "snapshots": tape.taken, "snapshot_ms": round(tape.snapshot.took_s * 1000, 3),
                  "replayed_steps": replay.steps, "replay_ms": round(replay_ms, 1),
                  "replay_in_plain_steps": round(replay_ms / plain_ms, 1)})


if __name__ == "__main__":
    main()
