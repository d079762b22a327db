"""The training scripts the launcher tests start (torchrun, accelerate launch, a launcher of the test's own): each
rank answers, trains a little, and prints ``RESULT {json}`` lines for the test to read.

``python ranks_for_tests.py MODE``: ``answer`` (best_config only), ``lightning`` (then a Lightning DDP fit with
the Config's keywords and the guard callback; rank 1's loss reads NaN from batch 10 in mixed precision, not in fp32),
``lightning-own`` (the same fit, two processes started by Lightning's own launcher), ``accelerate`` (then a few
steps through Accelerate, the guard in the loop), ``kinds`` (rank 0 asks for ``tiny_mlp``, the others for
``mlp``: the RanksError each rank gets), ``ddp`` (then a loop of its own over a DistributedDataParallel model under
the guard; rank 1's loss reads NaN from step 10 in mixed precision, not in fp32), ``fsdp`` (the same loop over a
model sharded by FSDP's ``fully_shard``), ``syncbn`` (no answer: rank 1 alone replays a model with SyncBatchNorm).
"""

from __future__ import annotations

import json
import logging
import os
import sys
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))  # the families the worker imports by name

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.data import DataLoader, TensorDataset

import autotune
from autotune._ranks.agree import digest

logging.basicConfig(level=logging.INFO, format=f"[rank {os.environ.get('RANK', '?')}] %(message)s", stream=sys.stderr)


def emit(rank: int | None = None, **fields: object) -> None:
    # One write per line: the ranks share the launcher's stdout.
    rank = rank if rank is not None else int(os.environ.get("RANK", "0"))
    sys.stdout.write("RESULT " + json.dumps({"rank": rank, **fields}) + "\n")
    sys.stdout.flush()


def answered(config: autotune.Config) -> dict[str, object]:
    agreement = config.evidence.agreement if config.evidence is not None else None
    return {"digest": digest(config), "device": config.device, "label": config.candidate.label,
            "precision": config.precision, "threads": config.num_threads, "torch_threads": torch.get_num_threads(),
            "reason": config.reason, "ranks": config.ranks.model_dump() if config.ranks else None,
            "own": agreement.own.label if agreement is not None and agreement.own is not None else None,
            "machine": os.environ.get("RANKS_TEST_MACHINE"), "fingerprint": config.fingerprint_digest}


def _data() -> TensorDataset:
    torch.manual_seed(0)
    return TensorDataset(torch.randn(480, 8), torch.randint(0, 4, (480,)))


def lightning_fit(config: autotune.Config, *, devices: int | None = None) -> nn.Module:
    """The fit; returns the module it trained (whose demotions ``best_config(model=...)`` leaves out)."""
    import lightning

    class Tiny(lightning.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))

        def setup(self, stage: str) -> None:
            self.rank = self.global_rank  # an attribute: the guard's replay trains a copy, without the trainer

        def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
            features, labels = batch
            loss = F.cross_entropy(self.net(features), labels)
            if self.rank == 1 and batch_idx >= 10 and torch.is_autocast_enabled("cpu"):
                # the mixed precision's loss reads NaN, fp32's does not (the guard's replay tells them apart); the
                # gradients stay finite
                loss = loss + torch.tensor(float("nan"))
            return loss

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.AdamW(self.parameters(), **config.optimizer_kwargs())

        def train_dataloader(self) -> DataLoader[tuple[Tensor, ...]]:
            return DataLoader(_data(), batch_size=4)

    callback = autotune.GuardCallback(config)
    kwargs = config.lightning_kwargs(devices=devices)
    trainer = lightning.Trainer(**kwargs, callbacks=[callback], max_steps=50, logger=False,
                                enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                                default_root_dir=os.environ["RANKS_TEST_DIR"])
    with warnings.catch_warnings(record=True) as warned:
        warnings.simplefilter("always")
        trainer.fit(module := Tiny())
    finding = callback.guard.finding
    emit(trainer.global_rank, trainer={k: str(v) for k, v in kwargs.items()}, world_size=trainer.world_size,
         job=callback.guard.job is not None,
         finding=finding.detail if finding is not None else None, step=finding.step if finding is not None else None,
         replay=finding.replay.model_dump() if finding is not None and finding.replay is not None else None,
         warned=sum(isinstance(w.message, autotune.ConfigMisbehaved) for w in warned))
    return module


def accelerate_steps(config: autotune.Config) -> None:
    import accelerate

    accelerator = accelerate.Accelerator(**config.accelerate_kwargs())
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    model, optimizer, loader = accelerator.prepare(
        model, torch.optim.AdamW(model.parameters(), **config.optimizer_kwargs()), DataLoader(_data(), batch_size=8))
    guard = config.guard()
    for features, labels in loader:
        loss = F.cross_entropy(model(features), labels)
        optimizer.zero_grad(set_to_none=True)
        accelerator.backward(loss)
        optimizer.step()
        guard.step(loss)
    emit(processes=accelerator.num_processes, distributed=str(accelerator.distributed_type),
         accelerator_device=str(accelerator.device), steps=guard.steps, finding=guard.check())


def _nan_under_autocast(model: nn.Module, batch: tuple[Tensor, Tensor, Tensor]) -> Tensor:
    """The loss; NaN where the batch is marked and autocast is on (fp32's is not: the replay tells them apart). The
    gradients stay finite, so DDP's all-reduce goes on."""
    features, labels, marked = batch
    loss = F.cross_entropy(model(features), labels)
    return loss + torch.tensor(float("nan")) if bool(marked) and torch.is_autocast_enabled("cpu") else loss


def ddp_steps(config: autotune.Config) -> None:
    import datetime as dt

    import torch.distributed as dist

    # A replay that joined the model's all-reduce on one rank would wait here at most this long, then fail the job.
    dist.init_process_group("gloo", timeout=dt.timedelta(seconds=30))
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = nn.parallel.DistributedDataParallel(nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)))
    optimizer = torch.optim.AdamW(model.parameters(), **config.optimizer_kwargs())
    guard = config.guard(model, optimizer, loss_fn=_nan_under_autocast)
    features, labels = _data().tensors
    with warnings.catch_warnings(record=True) as warned:
        warnings.simplefilter("always")
        for step in range(1, 51):
            batch = (features[step * 4:step * 4 + 4], labels[step * 4:step * 4 + 4],
                     torch.tensor(rank == 1 and step >= 10))
            with config.autocast():
                loss = _nan_under_autocast(model, batch)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            guard.step(loss, batch=batch)
        guard.check()
    dist.destroy_process_group()
    finding = guard.finding
    emit(ddp=True, finding=finding.detail if finding is not None else None,
         replay=finding.replay.model_dump() if finding is not None and finding.replay is not None else None,
         warned=sum(isinstance(w.message, autotune.ConfigMisbehaved) for w in warned))


def fsdp_steps(config: autotune.Config) -> None:
    import datetime as dt

    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard

    dist.init_process_group("gloo", timeout=dt.timedelta(seconds=30))
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = fully_shard(nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)))
    optimizer = torch.optim.AdamW(model.parameters(), **config.optimizer_kwargs())
    features, labels = _data().tensors
    with warnings.catch_warnings(record=True) as warned:
        warnings.simplefilter("always")
        guard = config.guard(model, optimizer, loss_fn=_nan_under_autocast)
        for step in range(1, 51):
            batch = (features[step * 4:step * 4 + 4], labels[step * 4:step * 4 + 4],
                     torch.tensor(rank == 1 and step >= 10))
            with config.autocast():
                loss = _nan_under_autocast(model, batch)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            guard.step(loss, batch=batch)
        guard.check()
    dist.destroy_process_group()
    finding = guard.finding
    emit(fsdp=type(model).__name__, finding=finding.detail if finding is not None else None,
         replay=finding.replay.model_dump() if finding is not None and finding.replay is not None else None,
         warned=sum(isinstance(w.message, autotune.ConfigMisbehaved) for w in warned))


def syncbn_replay() -> None:
    """Each rank keeps a SyncBatchNorm model's state and batches; rank 1 alone replays a NaN only its bf16 had, then
    both meet at a barrier. A replayed SyncBatchNorm that joined its all-reduce would wait for rank 0 there (on the
    CPU it refuses first: its forward runs on a GPU only, in a group of more than one)."""
    import datetime as dt
    import time

    import torch.distributed as dist

    from autotune._guard.replay import Tape
    from autotune._records import Candidate

    dist.init_process_group("gloo", timeout=dt.timedelta(seconds=30))
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.SyncBatchNorm(16), nn.ReLU(), nn.Linear(16, 4))
    try:
        model(torch.randn(4, 8))
        refused = None
    except ValueError as exc:
        refused = str(exc)
    tape = Tape(model, torch.optim.AdamW(model.parameters(), lr=1e-2), _nan_under_autocast)
    features, labels = _data().tensors
    for step in range(1, 21):
        tape.add((features[step * 4:step * 4 + 4], labels[step * 4:step * 4 + 4], torch.tensor(step >= 10)), step,
                 None)
    started = time.perf_counter()
    replay = tape.replay(Candidate(device="cpu", precision="bf16-mixed"), "non_finite", 20, step_ms=None,
                         limit_s=20.0) if rank == 1 else None
    took_s = time.perf_counter() - started
    dist.barrier()
    dist.destroy_process_group()
    emit(syncbn=True, refused=refused, took_s=took_s, replay=replay.model_dump() if replay is not None else None)


def main(mode: str) -> None:
    if mode == "syncbn":
        syncbn_replay()
        return
    if mode == "kinds":
        try:
            autotune.best_config("tiny_mlp" if os.environ["RANK"] == "0" else "mlp")
        except autotune.RanksError as exc:
            emit(error=str(exc))
        return
    autotune.register_family("slow_in", "families_for_tests:build_slow_in")
    config = autotune.best_config("slow_in")
    config.apply_threads()
    emit(**answered(config))
    if mode == "lightning":
        module = lightning_fit(config)
        # after the job-wide demotion of the module's configuration: every rank asks again, together
        again = autotune.best_config("slow_in", model=module)
        emit(again=answered(again))
    elif mode == "lightning-own":  # Lightning's own launcher starts rank 1 at fit, re-running this script
        lightning_fit(config, devices=2)
    elif mode == "accelerate":
        accelerate_steps(config)
    elif mode == "ddp":
        ddp_steps(config)
    elif mode == "fsdp":
        fsdp_steps(config)


if __name__ == "__main__":
    main(sys.argv[1])
