# with_torchrun.py: torchrun --nproc-per-node 2 examples/with_torchrun.py
# Every rank calls best_config with the same arguments: the machine's first rank measures, the others wait, and all
# get one answer for the job, each on its own device (cuda:LOCAL_RANK, or the CPU).
import autotune
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler

from my_app.models import Classifier, build, dataset, loss_fn


def main() -> autotune.LoopSummary:
    autotune.register_family("classifier", build)
    cfg = autotune.best_config("classifier")   # a collective: every rank, same arguments, same order
    cfg.apply_threads()                        # measured for this many processes (torchrun's default is 1)
    cfg.apply_precision()
    dist.init_process_group("nccl" if cfg.device_type == "cuda" else "gloo")
    model, optimizer = cfg.prepare(Classifier(), torch.optim.AdamW, lr=3e-4)   # on cuda:LOCAL_RANK or the CPU
    model = DistributedDataParallel(model)
    scaler = cfg.grad_scaler()
    data = dataset()
    loader = DataLoader(data, **cfg.dataloader_kwargs(data, batch_size=32, sampler=DistributedSampler(data)))
    guard = cfg.guard(model, optimizer, loss_fn=loss_fn)   # a finding on one rank is the job's
    for batch in guard.data(loader):
        with cfg.autocast():
            loss = loss_fn(model, cfg.prepare_batch(batch))
        optimizer.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        guard.step(loss, scaler)
    guard.check()
    # one write with its newline: the ranks share one stdout, and unbuffered print writes the newline apart
    print(f"rank {cfg.ranks.rank if cfg.ranks else 0}: {cfg.device} {cfg.precision}: {guard.summary()}\n", end="")
    dist.destroy_process_group()
    return guard.summary()


if __name__ == "__main__":
    main()
