"""Config.lightning_kwargs() and Config.accelerate_kwargs() against the real Lightning and Accelerate, on the CPU,
and the guard in their loops (autotune.GuardCallback; one guard.step line with Accelerate).

Each test trains two steps through the framework and records the autocast state seen inside the step: the
Config's precision must be what the framework actually runs, not just what it was told.
"""

from __future__ import annotations

import importlib
import subprocess
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path

import accelerate
import lightning
import pytest
import pytorch_lightning
import torch
import torch.nn.functional as F
from accelerate.state import AcceleratorState
from torch import Tensor, nn
from torch.utils.data import DataLoader, TensorDataset

import autotune
from autotune import Config, FrameworkError, _answer

AutocastSeen = tuple[bool, torch.dtype | None]


def _config(precision: str, device: str = "cpu") -> Config:
    return Config(model_kind="tiny", device=device, precision=precision, source="measured",  # type: ignore[arg-type]
                  reason="test", fingerprint_digest="d")


def _expected(config: Config) -> AutocastSeen:
    return (config.autocast_dtype is not None, config.autocast_dtype)


def _seen() -> AutocastSeen:
    enabled = torch.is_autocast_enabled("cpu")
    return (enabled, torch.get_autocast_dtype("cpu") if enabled else None)


def _data() -> TensorDataset:
    torch.manual_seed(0)
    return TensorDataset(torch.randn(8, 8), torch.randint(0, 4, (8,)))


class _Tiny:
    """A LightningModule's body, for the ``lightning`` and the ``pytorch_lightning`` package alike."""

    def __init__(self, config: Config) -> None:
        super().__init__()
        self.config = config
        self.net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
        self.seen: list[AutocastSeen] = []

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        self.seen.append(_seen())
        features, labels = batch
        return F.cross_entropy(self.net(features), labels)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), **self.config.optimizer_kwargs())

    def train_dataloader(self) -> DataLoader[tuple[Tensor, ...]]:
        return DataLoader(_data(), batch_size=4)


class TinyLightning(_Tiny, lightning.LightningModule):
    pass


class _PlTiny(_Tiny, pytorch_lightning.LightningModule):
    pass


def _fit(module: TinyLightning, tmp_path: Path, **trainer_kwargs: object) -> lightning.Trainer:
    trainer = lightning.Trainer(
        **trainer_kwargs, max_steps=2, logger=False, enable_checkpointing=False, enable_progress_bar=False,  # type: ignore[arg-type]
        enable_model_summary=False, default_root_dir=tmp_path,
    )
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*does not have many workers.*")
        trainer.fit(module)
    return trainer


@pytest.mark.parametrize("precision", ["fp32", "bf16-mixed"])
def test_lightning_trains_in_the_configs_precision(precision: str, tmp_path: Path) -> None:
    config = _config(precision)
    module = TinyLightning(config)
    trainer = _fit(module, tmp_path, **config.lightning_kwargs())
    assert trainer.global_step == 2
    assert module.seen == [_expected(config)] * 2
    assert module.device.type == "cpu"


class TinyModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
        self.seen: list[AutocastSeen] = []

    def forward(self, features: Tensor) -> Tensor:
        # Accelerate autocasts by wrapping forward(), so a forward pre-hook would not see it: record in here.
        self.seen.append(_seen())
        return self.net(features)  # type: ignore[no-any-return]


@pytest.fixture
def fresh_accelerate_state() -> Iterator[None]:
    """Accelerate keeps its state process-wide (a singleton): every test starts and ends without one."""
    AcceleratorState._reset_state(reset_partial_state=True)
    yield
    AcceleratorState._reset_state(reset_partial_state=True)


def _accelerate_steps(**accelerator_kwargs: object) -> TinyModel:
    accelerator = accelerate.Accelerator(**accelerator_kwargs)  # type: ignore[arg-type]
    model = TinyModel()
    optimizer = torch.optim.AdamW(model.parameters())
    prepared, optimizer, loader = accelerator.prepare(model, optimizer, DataLoader(_data(), batch_size=4))
    for features, labels in loader:
        loss = F.cross_entropy(prepared(features), labels)
        optimizer.zero_grad(set_to_none=True)
        accelerator.backward(loss)
        optimizer.step()
    assert accelerator.device.type == "cpu"
    return model


@pytest.mark.usefixtures("fresh_accelerate_state")
@pytest.mark.parametrize("precision", ["fp32", "bf16-mixed"])
def test_accelerate_trains_in_the_configs_precision(precision: str) -> None:
    config = _config(precision)
    model = _accelerate_steps(**config.accelerate_kwargs())
    assert model.seen == [_expected(config)] * 2


@pytest.mark.parametrize(("device", "expected"), [
    pytest.param("cpu", {"accelerator": "cpu", "devices": 1}, id="cpu"),
    pytest.param("cuda:1", {"accelerator": "cuda", "devices": [1]}, id="second-cuda-gpu"),
    pytest.param("mps", {"accelerator": "mps", "devices": 1}, id="mps"),
])
def test_lightning_device_words(device: str, expected: dict[str, object]) -> None:
    kwargs = _config("bf16-mixed", device).lightning_kwargs()
    assert kwargs == {**expected, "precision": "bf16-mixed"}


@pytest.mark.parametrize(("precision", "lightning_word", "accelerate_word"), [
    ("fp32", "32-true", "no"), ("tf32", "32-true", "no"), ("bf16-mixed", "bf16-mixed", "bf16"),
    ("fp16-mixed", "16-mixed", "fp16"),
])
def test_precision_words_on_a_gpu(precision: str, lightning_word: str, accelerate_word: str) -> None:
    config = _config(precision, "cuda:0")
    assert config.lightning_kwargs()["precision"] == lightning_word
    assert config.accelerate_kwargs() == {"cpu": False, "mixed_precision": accelerate_word}


def test_lightning_refuses_xpu_with_what_to_do() -> None:
    with pytest.raises(FrameworkError, match="no built-in accelerator for Intel XPU.*accelerate_kwargs"):
        _config("bf16-mixed", "xpu:0").lightning_kwargs()
    assert _config("bf16-mixed", "xpu:0").accelerate_kwargs() == {"cpu": False, "mixed_precision": "bf16"}


@pytest.mark.usefixtures("fresh_accelerate_state")
def test_fp16_on_the_cpu_is_refused_because_both_frameworks_would_run_something_else(tmp_path: Path) -> None:
    config = _config("fp16-mixed")
    with pytest.raises(FrameworkError, match="Lightning replaces"):
        config.lightning_kwargs()
    with pytest.raises(FrameworkError, match="trains without autocast"):
        config.accelerate_kwargs()
    # The evidence, with the real libraries: what they do with fp16 on the CPU when asked plainly ...
    assert _accelerate_steps(cpu=True, mixed_precision="fp16").seen == [(False, None)] * 2
    module = TinyLightning(config)
    with pytest.warns(UserWarning, match="Using `precision='bf16-mixed'` instead"):
        _fit(module, tmp_path, accelerator="cpu", devices=1, precision="16-mixed")
    assert module.seen == [(True, torch.bfloat16)] * 2
    # ... and the way around it that the Lightning error names.
    module = TinyLightning(config)
    _fit(module, tmp_path, **config.lightning_kwargs(init_scale=True))
    assert module.seen == [(True, torch.float16)] * 2


@pytest.mark.parametrize("package", ["lightning", "pytorch_lightning"])
def test_the_fp16_init_scale_recipe_works_as_written(package: str, tmp_path: Path) -> None:
    """``Trainer(**cfg.lightning_kwargs(init_scale=True))``: fp16 autocast, GradScaler at the Config's init_scale."""
    config = _config("fp16-mixed").model_copy(update={"init_scale": 1024.0})
    kwargs = config.lightning_kwargs(init_scale=True)
    assert "precision" not in kwargs and kwargs["accelerator"] == "cpu"
    [plugin] = kwargs["plugins"]
    assert plugin.scaler.get_scale() == 1024.0 and type(plugin).__module__.startswith("lightning")
    trainer_module = importlib.import_module(package)
    if package == "pytorch_lightning":  # the plugin comes from the package the app imported
        with pytest.MonkeyPatch.context() as patch:
            patch.delitem(sys.modules, "lightning")
            kwargs = config.lightning_kwargs(init_scale=True)
        assert type(kwargs["plugins"][0]).__module__.startswith("pytorch_lightning")
    module = TinyLightning(config) if package == "lightning" else _PlTiny(config)
    trainer = trainer_module.Trainer(**kwargs, max_steps=2, logger=False, enable_checkpointing=False,
                                     enable_progress_bar=False, enable_model_summary=False, default_root_dir=tmp_path)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*does not have many workers.*")
        trainer.fit(module)
    assert module.seen == [(True, torch.float16)] * 2


# -- the guard through the frameworks' own loops ---------------------------------------------------------------


class _Overflowing:
    """From batch ``overflow_from`` on, the loss is weighted 1e6, doubling with each batch (to 2**30 times it): its
    fp16 gradients overflow at every step, faster than GradScaler's halving catches up."""

    def __init__(self, overflow_from: int) -> None:
        super().__init__()
        self.overflow_from = overflow_from
        self.net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        features, labels = batch
        weight = 1e6 * 2.0 ** min(batch_idx - self.overflow_from, 30) if batch_idx >= self.overflow_from else 1.0
        self.log("loss", F.cross_entropy(self.net(features), labels))  # what a module does; not during a replay
        return F.cross_entropy(self.net(features), labels) * weight

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=1e-2)

    def train_dataloader(self) -> DataLoader[tuple[Tensor, ...]]:
        torch.manual_seed(0)
        return DataLoader(TensorDataset(torch.randn(800, 8), torch.randint(0, 4, (800,))), batch_size=4)


class OverflowingLightning(_Overflowing, lightning.LightningModule):
    pass


class OverflowingPl(_Overflowing, pytorch_lightning.LightningModule):
    pass


class ManualLightning(_Overflowing, lightning.LightningModule):
    def __init__(self) -> None:
        super().__init__(overflow_from=1_000)
        self.automatic_optimization = False

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        optimizer = self.optimizers()
        loss = super().training_step(batch, batch_idx)
        optimizer.zero_grad()  # type: ignore[union-attr]
        self.manual_backward(loss)
        optimizer.step()  # type: ignore[union-attr]
        return loss


def _fit_guarded(package: str, module: object, callback: object, tmp_path: Path, **kwargs: object) -> None:
    trainer = importlib.import_module(package).Trainer(
        accelerator="cpu", devices=1, callbacks=[callback], max_epochs=1, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, default_root_dir=tmp_path, **kwargs)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*does not have many workers.*")
        warnings.filterwarnings("ignore", message=".*self.log.*")
        trainer.fit(module)


@pytest.mark.parametrize("package", ["lightning", "pytorch_lightning"])
def test_the_lightning_callback_sees_gradscaler_skip_steps_replays_them_and_demotes(
    package: str, tmp_path: Path
) -> None:
    config = _config("fp16-mixed").model_copy(update={"fingerprint_digest": autotune.fingerprint().digest})
    callback = autotune.GuardCallback(config)
    module = OverflowingLightning(overflow_from=100) if package == "lightning" else OverflowingPl(overflow_from=100)
    plugins = "lightning.pytorch.plugins.precision" if package == "lightning" else "pytorch_lightning.plugins.precision"
    plugin = importlib.import_module(plugins).MixedPrecision("16-mixed", "cpu")
    with pytest.warns(autotune.ConfigMisbehaved, match="at step 101: GradScaler skipped 25 optimizer steps in a row.*"
                      r"fp16-mixed misbehaves again \(at replayed step \d+\) and fp32 does not"):
        _fit_guarded(package, module, callback, tmp_path, plugins=[plugin])
    finding = callback.guard.finding
    assert finding is not None and finding.seen == "skipped_steps"
    assert [d.step for d in _answer.demotions("tiny")] == [101]


def test_the_lightning_callback_refuses_manual_optimization_saying_what_to_do(tmp_path: Path) -> None:
    callback = autotune.GuardCallback(_config("bf16-mixed"))
    with pytest.raises(FrameworkError, match=r"manual optimization.*call guard.step\(loss, scaler, batch=batch\) in "
                       "training_step after your optimizer step"):
        _fit_guarded("lightning", ManualLightning(), callback, tmp_path)


def test_without_lightning_the_callback_says_what_to_install(tmp_path: Path) -> None:
    script = ("import sys; sys.modules['lightning'] = sys.modules['pytorch_lightning'] = None\n"  # neither importable
              "import autotune\n"
              "try:\n    autotune.GuardCallback\nexcept ImportError as exc:\n    print(exc)\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True)
    assert done.stdout.startswith("autotune.GuardCallback needs Lightning: pip install lightning (or pytorch-")


def test_the_lightning_callback_takes_the_config_best_config_answered() -> None:
    # The callback asks the Config for its guard without importing it (the adapters sit below the Config): a bare
    # decision has no guard to make.
    from autotune._decision import Decision

    with pytest.raises(TypeError, match="takes the Config best_config answered, got Decision"):
        autotune.GuardCallback(Decision.model_validate(_config("fp32").model_dump()))


def test_the_guard_is_one_line_in_accelerates_loop(fresh_accelerate_state: None) -> None:
    """NaN in the data from batch 30 on: the bf16 run's losses are NaN, and its weights with them; replayed, fp32's
    are too: the data's doing, nothing is demoted."""
    config = _config("bf16-mixed").model_copy(update={"fingerprint_digest": autotune.fingerprint().digest})
    accelerator = accelerate.Accelerator(**config.accelerate_kwargs())
    torch.manual_seed(0)
    features = torch.randn(400, 8)
    features[120:] = float("nan")
    model = TinyModel()
    optimizer = torch.optim.AdamW(model.parameters())
    loader = DataLoader(TensorDataset(features, torch.randint(0, 4, (400,))), batch_size=4)
    prepared, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    guard = config.guard(prepared, optimizer, loss_fn=lambda m, batch: F.cross_entropy(m(batch[0]), batch[1]))
    with pytest.warns(autotune.ConfigMisbehaved, match="at step 31: 3 non-finite losses.*fp32 misbehaves too"):
        for inputs, labels in loader:
            loss = F.cross_entropy(prepared(inputs), labels)
            optimizer.zero_grad(set_to_none=True)
            accelerator.backward(loss)
            optimizer.step()
            guard.step(loss, accelerator.scaler, batch=(inputs, labels))  # the one line; the scaler: with fp16
        guard.check()
    assert _answer.demotions("tiny") == []
