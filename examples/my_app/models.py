# my_app/models.py
import autotune
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset


class Classifier(nn.Module):                     # the model you train
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(3 * 32 * 32, 256), nn.ReLU(), nn.Linear(256, 10))

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.net(images)


def loss_fn(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    images, labels = batch                       # forward + loss, as your loop computes them
    return F.cross_entropy(model(images), labels)


def build(batch_size: int = 64) -> autotune.Workload:
    """My model and one batch of the shape my loader hands it."""
    batch = (torch.randn(batch_size, 3, 32, 32), torch.randint(0, 10, (batch_size,)))
    return autotune.Workload(Classifier(), batch, loss_fn)   # optimizer=...: AdamW unless you say


def dataset(samples: int = 192) -> TensorDataset:
    """Random images and labels standing in for your data in these examples."""
    return TensorDataset(torch.randn(samples, 3, 32, 32), torch.randint(0, 10, (samples,)))
