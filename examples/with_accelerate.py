# with_accelerate.py: python examples/with_accelerate.py   (pip install accelerate)
import accelerate
import autotune
import torch
from accelerate.utils import GradScalerKwargs
from torch.utils.data import DataLoader

from my_app.models import Classifier, build, dataset, loss_fn


def main() -> autotune.LoopSummary:
    autotune.register_family("classifier", build)
    cfg = autotune.best_config("classifier")
    print(cfg.reason)
    cfg.apply_threads()
    cfg.apply_precision()
    scaler = [GradScalerKwargs(init_scale=cfg.init_scale)] if cfg.init_scale else []   # fp16 only
    accelerator = accelerate.Accelerator(**cfg.accelerate_kwargs(), kwargs_handlers=scaler)  # device, precision
    model = Classifier()
    if cfg.memory_format == "channels_last":
        model = model.to(memory_format=torch.channels_last)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, **cfg.optimizer_kwargs())
    data = dataset()
    loader = DataLoader(data, **cfg.dataloader_kwargs(data, batch_size=64, shuffle=True))
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    guard = cfg.guard(model, optimizer, loss_fn=loss_fn)   # on what accelerator.prepare returned
    for batch in guard.data(loader):
        with accelerator.autocast():
            loss = loss_fn(model, cfg.prepare_batch(batch))
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        guard.step(loss, accelerator.scaler)
    guard.check()
    print(guard.summary())
    return guard.summary()


if __name__ == "__main__":
    main()
