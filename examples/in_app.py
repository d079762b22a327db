# in_app.py: python examples/in_app.py
# An app's first launch never blocks: calibration starts in the background, training starts at once with the best
# answer available, and switches to the measured one at an epoch boundary.
import autotune
import torch
from torch.utils.data import DataLoader

from my_app.models import Classifier, build, dataset, loss_fn


def train_one_epoch(cfg: autotune.Config, loader: DataLoader) -> None:
    model, optimizer = cfg.prepare(Classifier(), torch.optim.AdamW, lr=3e-4)
    for batch in loader:
        with cfg.autocast():
            loss = loss_fn(model, cfg.prepare_batch(batch))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()


def main() -> autotune.Config:
    autotune.register_family("classifier", build)
    job = autotune.start_calibration(["classifier"],   # returns at once; one worker process measures
                                     progress=lambda p: print(f"calibrating {p.family}: {p.fraction:.0%}"))
    cfg = autotune.best_config("classifier", wait=False)  # never measures, never waits
    print(cfg.source, "-", cfg.reason)   # "heuristic - fp32 on the CPU, which always trains: ..."
    loader = DataLoader(dataset(), batch_size=64, shuffle=True)
    for _ in range(3):
        train_one_epoch(cfg, loader)
        if cfg.source == "heuristic" and job.done():      # at an epoch boundary: switch to the measured answer
            cfg = autotune.best_config("classifier")
            print(cfg.source, "-", cfg.reason)
    job.wait(timeout=600)   # an app that quits early calls job.cancel() instead: no worker is left behind
    return autotune.best_config("classifier")


if __name__ == "__main__":
    autotune.freeze_support()   # first in a frozen app (cx_Freeze, Nuitka, Briefcase); returns at once elsewhere
    main()
