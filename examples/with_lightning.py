# with_lightning.py: python examples/with_lightning.py   (pip install lightning)
import autotune
import lightning
import torch
from torch.utils.data import DataLoader

from my_app.models import Classifier, build, dataset, loss_fn


class LitClassifier(lightning.LightningModule):
    def __init__(self, cfg: autotune.Config) -> None:
        super().__init__()
        self.cfg = cfg
        self.model = Classifier()
        self.data = dataset()

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        return loss_fn(self.model, batch)

    def configure_optimizers(self) -> torch.optim.Optimizer:   # fused kernels when they measured faster
        return torch.optim.AdamW(self.parameters(), lr=3e-4, **self.cfg.optimizer_kwargs())

    def on_after_batch_transfer(self, batch: tuple[torch.Tensor, torch.Tensor], dataloader_idx: int) -> object:
        return self.cfg.prepare_batch(batch)                   # images in channels_last when that won

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.data, **self.cfg.dataloader_kwargs(self.data, batch_size=64, shuffle=True))


def main() -> lightning.Trainer:
    autotune.register_family("classifier", build)
    cfg = autotune.best_config("classifier")
    print(cfg.reason)
    cfg.apply_threads()
    cfg.apply_precision()                                      # tf32 / fp32 matmul settings, process-wide
    module = LitClassifier(cfg).to(memory_format=torch.channels_last if cfg.memory_format == "channels_last"
                                   else torch.contiguous_format)
    trainer = lightning.Trainer(**cfg.lightning_kwargs(init_scale=True),  # accelerator, devices, precision
                                callbacks=[autotune.GuardCallback(cfg)], max_epochs=1, logger=False,
                                enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(module)
    return trainer


if __name__ == "__main__":
    main()
