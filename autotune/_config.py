"""The answer: which device and precision to train with, why, and helpers that apply it."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, TypeVar

import torch
from torch import nn

from autotune._answer import best_decision
from autotune._apply import axes
from autotune._apply import fp32 as _fp32
from autotune._apply import precision as _precision
from autotune._decision import Decision, Source
from autotune._ranks.group import joined
from autotune._records import Prefer
from autotune.backends import backend_for

if TYPE_CHECKING:
    from autotune._guard.watch import Guard, OnFailure
    from autotune._reports import LoaderReport

Batch = TypeVar("Batch")


class Config(Decision):
    """A training configuration, e.g. ``Config(model_kind="cnn", device="cpu", precision="bf16-mixed", ...)``.

    The device, precision and variants are the measured candidate's (:class:`Choice`); ``reason`` is one
    sentence of at most 160 characters for a log or a status bar, the answer and its strongest evidence, e.g.
    ``"bf16 mixed precision with channels_last on the CPU: 2.5x faster per step than fp32 (measured 2026-12-02)"``;
    ``evidence`` holds the whole argument as data. ``source`` says where the answer came from: ``measured`` on
    this machine, ``forced`` by ``AUTOTUNE_DEVICE``, or ``heuristic`` when no measurement was possible (the
    reason says why and what it falls back to).
    """

    @property
    def autocast_dtype(self) -> torch.dtype | None:
        """``torch.bfloat16`` / ``torch.float16`` for mixed precision, None for fp32 and tf32."""
        return _precision.AUTOCAST_DTYPES[self.precision]

    @contextlib.contextmanager
    def autocast(self) -> Iterator[None]:
        """Wrap forward + loss: ``with cfg.autocast(): loss = model(x)``; a no-op for fp32 and tf32.

        TF32 is not switched here: it is a process-wide setting, applied by :meth:`apply_precision`.
        """
        with _precision.autocast(self.device_type, self.precision):
            yield

    def apply_precision(self) -> None:
        """Set how fp32 matmuls, convolutions and RNNs compute, process-wide, as calibration measured it.

        - ``fp32``: IEEE fp32 for all of them (cuBLAS, cuDNN, oneDNN): torch's default runs cuDNN convolutions
          and RNNs in TF32 on Ampere and later GPUs.
        - ``tf32``: TF32 for CUDA matmuls, convolutions and RNNs (forward, backward and optimizer alike).
        - mixed precisions: nothing changes (autocast decides; the fp32 operations it leaves keep the app's
          settings, which calibration measured with).

        torch builds with per-backend settings (2.9+) are set through them (``torch.backends.cuda.matmul.
        fp32_precision`` and ``torch.backends.cudnn.conv`` / ``.rnn`` / ``torch.backends.mkldnn.*``), older
        builds through ``torch.set_float32_matmul_precision`` and ``torch.backends.cudnn.allow_tf32``. torch
        forbids mixing the two: after this call on a 2.9+ build, read the per-backend values, not
        ``torch.get_float32_matmul_precision()``.

        On NVIDIA CUDA it also turns on cuDNN's benchmark mode (``torch.backends.cudnn.benchmark``), which
        calibration measured with.
        """
        _fp32.apply(self.precision)
        backend_for(self.device).apply_loop_settings()

    def optimizer_kwargs(self, optimizer: Callable[..., torch.optim.Optimizer] = torch.optim.AdamW) -> dict[str, Any]:
        """``{"fused": True}``, ``{"foreach": True}`` or ``{}``: the measured implementation, if ``optimizer`` takes it.

        Calibration measures these variants with AdamW; an optimizer without the keyword (RMSprop has no
        ``fused``) gets ``{}``, and a WARNING on the ``autotune`` logger says the measured variant is not applied.
        """
        return axes.optimizer_kwargs_for(optimizer, self, {})

    def prepare(
        self,
        model: nn.Module,
        optimizer: Callable[..., torch.optim.Optimizer] = torch.optim.AdamW,
        **options: Any,
    ) -> tuple[nn.Module, torch.optim.Optimizer]:
        """Model on the device in the measured memory format, and its optimizer in the measured implementation.

        ``model, opt = cfg.prepare(model, torch.optim.AdamW, lr=3e-4)``. With ``compiled`` the returned model is
        ``torch.compile``'d (it shares its parameters with ``model``). The measured ``fused`` / ``foreach``
        implementation is passed only to an optimizer that takes it, and never over the caller's own ``fused=``
        or ``foreach=`` (a log line says when the measured variant is not applied).
        """
        model = model.to(self.device, **axes.model_keywords(self))
        built = optimizer(model.parameters(), **options, **axes.optimizer_kwargs_for(optimizer, self, options))
        return axes.forward(self, model), built

    def prepare_batch(self, batch: Batch) -> Batch:
        """A batch as the loader hands it on the device, as calibration moved it; images in the measured layout.

        ``images, labels = cfg.prepare_batch((images, labels))``; ``batch = cfg.prepare_batch(encoding)``. The
        tensors of a tensor, tuple, list, dict or other mapping (a Hugging Face ``BatchEncoding``) or dataclass,
        nested, are moved into new containers of the same types; other values (ints, strings, None) are kept.
        """
        return axes.move_batch(self, batch)

    def apply_threads(self) -> None:
        """Set torch's CPU thread count (process-wide) when fewer threads measured faster; else a no-op."""
        axes.set_process(self)

    def lightning_kwargs(self, *, devices: int | None = None, init_scale: bool = False) -> dict[str, Any]:
        """Keyword arguments for ``lightning.Trainer``,
        e.g. ``{"accelerator": "cpu", "devices": 1, "precision": "bf16-mixed"}``.

        ``trainer = lightning.Trainer(**cfg.lightning_kwargs(init_scale=True), max_epochs=10)``

        Carries over the device (``"cuda:1"`` -> ``accelerator="cuda", devices=[1]``; ``"mps"``; ``"cpu"``, one
        process) and the precision (``"32-true"``, ``"bf16-mixed"``, ``"16-mixed"``). ``init_scale=True``: an fp16
        Config gets ``plugins=[MixedPrecision("16-mixed", device, scaler=cfg.grad_scaler())]`` in place of
        ``precision``, so GradScaler starts at the init_scale calibration found safe (the plugin comes from the
        Lightning package the app imported: ``lightning`` first, else ``pytorch_lightning``). A Config answered in a
        job (``ranks``: under torchrun, which Lightning detects) gives the job's ``devices``, ``num_nodes`` and
        ``strategy="ddp"``, each rank on ``cuda:LOCAL_RANK`` as the Config places it; ``devices=N`` asks Lightning's
        own launcher for N processes here (``strategy="ddp"``; their CPU thread counts are then Lightning's, not
        measured). What Lightning has no switch for (tf32, threads, channels_last, the fused optimizer, compilation)
        you apply yourself: the docs' Lightning page (``docs/how-to/lightning.md``) shows each.

        Raises :class:`FrameworkError` where Lightning would run something else than was measured: fp16 on the
        CPU without ``init_scale=True`` (Lightning warns and trains in bf16 instead), Intel XPU (no built-in
        Lightning accelerator) and more than one process on MPS (one device, which Lightning's DDP does not take).
        """
        from autotune._frameworks import lightning  # an adapter: loaded for an app that asks for it

        return lightning.trainer_kwargs(self, devices=devices, init_scale=init_scale)

    def accelerate_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for ``accelerate.Accelerator``, e.g. ``{"cpu": True, "mixed_precision": "bf16"}``.

        ``accelerator = accelerate.Accelerator(**cfg.accelerate_kwargs())``

        Carries over the device (``cpu=True`` for the CPU; otherwise Accelerate takes the GPU it finds, the
        current CUDA device for CUDA) and the precision (``"no"``, ``"bf16"``, ``"fp16"``). In a job (``accelerate
        launch`` or torchrun) the launch is Accelerate's to read: it places each process on ``cuda:LOCAL_RANK``, as
        the Config does, and with ``cpu=True`` trains every process on the CPU over gloo. One process on a GPU other
        than the first: ``torch.cuda.set_device(cfg.device)`` before creating the Accelerator. What Accelerate has
        no switch for (tf32, threads, channels_last, the fused optimizer, fp16's init_scale, compilation) you apply
        yourself: the docs' Accelerate page (``docs/how-to/accelerate.md``) shows each.

        Raises :class:`FrameworkError` for fp16 on the CPU: Accelerate accepts ``mixed_precision="fp16"`` with
        ``cpu=True`` and then trains without autocast, in fp32.
        """
        from autotune._frameworks import accelerate  # an adapter: loaded for an app that asks for it

        return accelerate.accelerator_kwargs(self)

    def guard(self, model: nn.Module | None = None, optimizer: torch.optim.Optimizer | None = None, *,
              loss_fn: Callable[[nn.Module, Any], torch.Tensor] | None = None,
              on_failure: OnFailure = "warn") -> Guard[Config]:
        """A guard for the training loop: ``guard.step(loss, scaler, batch=batch)`` once per step, after
        ``scaler.update()``.

        ``guard = cfg.guard(model, optimizer, loss_fn=lambda m, batch: F.cross_entropy(m(batch[0]), batch[1]))``

        It watches for non-finite losses, steps GradScaler skips beyond its early back-off, and a loss that
        diverges, at no synchronization per step; on a finding it warns (:class:`ConfigMisbehaved`; raises it with
        ``on_failure="raise"``). Before it blames the configuration it replays the steps since a state it keeps on
        the host, in fp32 (``loss_fn(model, batch)`` on the batches ``step`` was given): where fp32 misbehaves too,
        it is the training and nothing is demoted; where only this precision does, it is demoted on this machine for
        this model, so that ``best_config`` and ``guard.fallback()`` answer the best remaining candidate. Without
        the model, optimizer and ``loss_fn`` the guard cannot replay: it warns and demotes nothing. The rules:
        ``autotune._guard.watch``; the replay's cost: ``autotune._guard.replay``. ``for batch in guard.data(loader):``
        also times the loop's waits for data (``guard.summary()``). In a job (``ranks``), a finding on one rank is
        the job's: every rank warns at the same step, each machine records one demotion (and keeps its first rank's
        loop summary), and every rank must call ``step`` (and ``check``) alike.
        """
        from autotune._guard.watch import Guard  # the guard's machinery: for a loop that asks for it

        return Guard(self.model_kind, self.candidate, self.fingerprint_digest, on_failure=on_failure, model=model,
                     optimizer=optimizer, loss_fn=loss_fn, step_ms=self.step_ms, speedup=self.speedup_vs_fp32_cpu,
                     job=joined(required=True) if self.ranks is not None else None, answer=best_config)

    def dataloader_kwargs(self, dataset: Any, *, batch_size: int, key: str | None = None,
                          **fixed: Any) -> dict[str, Any]:
        """``DataLoader(dataset, **cfg.dataloader_kwargs(dataset, batch_size=64))``: the keyword arguments that
        measured fastest for this machine, this config and this dataset, e.g. ``{"num_workers": 2, "pin_memory":
        False, "persistent_workers": True, "prefetch_factor": 2, "batch_size": 64}``.

        Measured for a few seconds (``_tools.loader.BUDGET_S``) in the loop as you run it, a DataLoader over
        ``dataset`` whose batches are copied to this config's device and followed by its recorded step time (no
        model is built; see :meth:`dataloader_report`), then answered at once from the
        cache for the same dataset signature (type, length, one sample's structure without its sizes), batch size
        and ``key`` (name a new version of your data with it). ``fixed`` DataLoader arguments (``shuffle=True``,
        ``collate_fn=...``, ``num_workers=4``) are measured with and returned as given; with ``batch_sampler=``,
        whose batches DataLoader takes instead of a batch size, ``batch_size`` is your batches' usual size, the
        training step's, and is not returned. On the CPU the choice is joint with the training threads: where it
        was measured with fewer, this sets torch's thread count to them (process-wide, as :meth:`apply_threads`
        does; an INFO log line says so).
        """
        report = self.dataloader_report(dataset, batch_size=batch_size, key=key, **fixed)
        if report.num_threads is not None and torch.get_num_threads() != report.num_threads:
            log.info("training with %d CPU threads beside %d DataLoader workers, as measured together",
                     report.num_threads, report.num_workers)
            torch.set_num_threads(report.num_threads)
        batching = {} if fixed.get("batch_sampler") is not None else {"batch_size": batch_size}
        return {**report.tuned(), **batching, **fixed}

    def dataloader_report(self, dataset: Any, *, batch_size: int, key: str | None = None, budget_s: float | None = None,
                          force: bool = False, **fixed: Any) -> LoaderReport:
        """What :meth:`dataloader_kwargs` answers, with the evidence: every setting timed, the step alone, the
        reason (per training step) and what the measurement cost (``wall_s``); ``force=True`` measures again.

        Without workers first, then the most (the usable cores; in a job, ``ranks``, each of the machine's
        processes' share of them), then the counts between; on the CPU each with this config's training threads and
        with fewer; workers start as your DataLoader starts them (the default start method, or your
        ``multiprocessing_context``). The cheapest setting whose loop keeps within 10% of its training step wins,
        else the fastest. A setting whose worker dies or hangs is ruled out, with the cause where one is found (a
        dataset spawned workers cannot receive); where none with workers could run, ``num_workers=0`` with the
        causes, not cached; a dataset that is empty or raises is a :class:`DatasetError`, and nothing is cached.
        """
        from autotune._tools import loader as _loader  # loads the training step's machinery: only when asked

        return _loader.report(self.candidate, self.model_kind, self.fingerprint_digest, dataset,
                              batch_size=batch_size, key=key, fixed=fixed, step_ms=self.step_ms,
                              budget_s=_loader.BUDGET_S if budget_s is None else budget_s, force=force,
                              processes=self.ranks.local_world_size if self.ranks is not None else 1)

    def grad_scaler(self) -> torch.amp.GradScaler:
        """A GradScaler enabled only for fp16, starting at the init_scale calibration found safe."""
        return _precision.grad_scaler(self.device_type, self.precision, self.init_scale)


log = logging.getLogger("autotune")


def best_config(
    model_kind: str, *, model: nn.Module | None = None, prefer: Prefer = "auto", expected_steps: int | None = None,
    calibrate_on_miss: bool = True, wait: bool = True, distributed: bool | None = None,
) -> Config:
    """The fastest correct device and precision for ``model_kind`` on this machine.

    Answered from the cache when this machine (its fingerprint) has measured this family before, or from the
    defaults layer (``AUTOTUNE_DEFAULTS``) when it holds a record of exactly this machine configuration;
    otherwise the family is calibrated first (seconds to a minute). ``wait=False`` never measures and never
    waits for another process's calibration: without a measurement it answers at once with a ``heuristic``
    Config whose reason says why ("calibration running", "not measured yet") and what it is based on (a
    record of the same hardware with other software, else fp32 on the CPU); ``calibrate_on_miss=False`` is the
    older spelling. ``prefer``: "auto", "cpu", "gpu" (whichever accelerator is here) or a backend's name, "cuda",
    "mps" or "xpu", the words ``AUTOTUNE_DEVICE`` takes; ``expected_steps`` makes set-up cost count for short
    jobs. The answer leaves out what training runs demoted here for ``model`` (an ``nn.Module``; by default the
    model the family builds).

    In a job of many processes (torchrun, ``accelerate launch``, Lightning under torchrun: the launcher's ``RANK``
    and ``WORLD_SIZE``, or torch.distributed's default group of more than one) every rank calls it with the same
    arguments, in the same order (else every rank raises :class:`RanksError`, naming both): each machine's first
    rank measures, a CPU candidate timed while as many copies of its step run as the machine has processes, and
    every rank gets rank 0's machine's choice on its own device (``cuda:LOCAL_RANK``) and its machine's CPU thread
    count (``Config.ranks`` says where it stands). ``distributed=False`` answers for this process alone;
    ``distributed=True`` raises :class:`RanksError` outside a job.
    """
    return config_of(best_decision(model_kind, model=model, prefer=prefer, expected_steps=expected_steps,
                                    calibrate_on_miss=calibrate_on_miss, wait=wait, distributed=distributed))


#: the Config of each decision answered in this process, by its id, with the decision (kept alive: its id stays its
#: own): a memoised answer (``_answer``) is the same Config again
_configs: dict[int, tuple[Decision, Config]] = {}


def config_of(decision: Decision) -> Config:
    """``decision`` as the Config that applies it (its fields as they are: a Decision is validated already)."""
    known = _configs.get(id(decision))
    if known is not None and known[0] is decision:
        return known[1]
    config = Config.model_construct(decision.model_fields_set, **dict(decision))
    _configs[id(decision)] = (decision, config)
    return config


def forget() -> None:
    """Forget the Configs of this process's answers (with ``_answer.forget``, its decisions)."""
    _configs.clear()


__all__ = ["Config", "Source", "best_config", "config_of", "forget"]
