# train.py: python examples/train.py
import autotune
import torch
from torch.utils.data import DataLoader

from my_app.models import Classifier, build, dataset, loss_fn


def main() -> autotune.LoopSummary:
    data = dataset()                               # your Dataset
    autotune.register_family("classifier", build)  # version="2" when the model changes: measured again
    cfg = autotune.best_config("classifier")       # measured once per machine (seconds), then instant from the cache
    print(cfg.reason)   # e.g. "bf16 mixed precision with channels_last on the CPU: 2.5x faster per step than fp32 ..."

    cfg.apply_threads()                            # the CPU thread count that measured fastest (CPU configs)
    cfg.apply_precision()                          # fp32: IEEE matmuls + convolutions; tf32: TF32 (process-wide)
    model, optimizer = cfg.prepare(Classifier(), torch.optim.AdamW, lr=3e-4)  # device, layout, fused optimizer
    scaler = cfg.grad_scaler()                     # enabled only for fp16, with the init_scale found safe
    loader = DataLoader(data, **cfg.dataloader_kwargs(data, batch_size=64, shuffle=True))  # workers measured here
    guard = cfg.guard(model, optimizer, loss_fn=loss_fn)   # demotes a configuration that misbehaves in training
    for batch in guard.data(loader):               # times the loop's waits for data, keeps the batch for a replay
        with cfg.autocast():                       # no-op for fp32
            loss = loss_fn(model, cfg.prepare_batch(batch))   # on the device; channels_last when that won
        optimizer.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        guard.step(loss, scaler)                   # no synchronization; reads the device every 50 steps
    guard.check()
    print(guard.summary())                         # steps, the share of the loop spent waiting for data, ms per step
    return guard.summary()


if __name__ == "__main__":
    main()
