"""What the DataLoader tests share: a small budget, a measured answer made by hand, and datasets with a real
per-sample cost (``Blurred``) or none (``Vectors``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.utils.data import (
    Dataset,
)

import autotune
from autotune import Config

#: a small budget: each setting's loop is timed over a tenth of it
BUDGET_S = 1.0


def hand_config(kind: str, step_ms: float | None = 1.0) -> Config:
    """A measured answer made by hand: fp32 on one CPU thread (which precision wins is not the subject), a step of
    ``step_ms`` at the family's own batch."""
    return Config(model_kind=kind, device="cpu", precision="fp32", num_threads=1, source="measured",
                  reason="measured by hand", fingerprint_digest=autotune.fingerprint().digest, step_ms=step_ms)


class Blurred(Dataset[tuple[torch.Tensor, int]]):
    """Seeded 3x32x32 images, each blurred by ``passes`` 5x5 box filters when loaded: a real per-sample CPU cost,
    about a millisecond per pass on one core."""

    def __init__(self, length: int = 256, passes: int = 6) -> None:
        self.length = length
        self.passes = passes
        self.kernel = torch.ones(3, 1, 5, 5) / 25

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        image = torch.rand(1, 3, 32, 32, generator=torch.Generator().manual_seed(index))
        for _ in range(self.passes):
            image = F.conv2d(image, self.kernel, padding=2, groups=3)
        return image[0], index % 4


class Vectors(Dataset[torch.Tensor]):
    def __init__(self, length: int = 32) -> None:
        self.length = length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> torch.Tensor:
        return torch.full((8,), float(index))
