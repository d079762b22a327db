"""A same-math close call on the real CPU: a family whose channels_last step is 4.5% faster, at ~8% per-step noise.

The family's step is real compute: a small conv net whose forward also runs a block of small matrix products
outside autograd, ``--gain`` more of them when the input is not channels_last, their number drawn per step from a
log-normal of ``--noise`` spread (the same draw for every layout). Everything else about the two layouts is the
same math, so the right pick uses channels_last, whatever its precision, optimizer or threads. Each of ``--runs``
cold calibrations runs in its own worker, as in production, one after another; the load average beside each.

    python benchmarks/close_call.py [--runs 20] [--gain 0.045] [--noise 0.08] [--step-ms 8]
    python benchmarks/close_call.py --quick     # two calibrations: checks the script works, not a figure

Goal: channels_last picked in >= 19 of 20 calibrations.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import torch
from _common import emit, picked
from torch import Tensor, nn

from autotune import Workload, register_family
from autotune._calibrate import measure_family
from autotune._families import cross_entropy

#: products of FILLER x FILLER matrices a step runs at its nominal cost; set by ``main`` from ``--step-ms``
_SIZE = 96


class _Filler(nn.Module):
    """A conv net that pays ``1 + gain`` times the filler's compute unless its input is channels_last."""

    def __init__(self, products: int, gain: float, noise: float) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.head = nn.Linear(8 * 16 * 16, 10)
        self.products, self.gain, self.noise = products, gain, noise
        self.draws = torch.Generator().manual_seed(0)
        self.a, self.b = torch.randn(_SIZE, _SIZE), torch.randn(_SIZE, _SIZE)

    def forward(self, x: Tensor) -> Tensor:
        layout_gain = 1.0 if x.is_contiguous(memory_format=torch.channels_last) and not x.is_contiguous() else (
            1.0 + self.gain)
        spread = float(torch.empty(()).log_normal_(0.0, self.noise, generator=self.draws))
        with torch.no_grad():
            for _ in range(round(self.products * layout_gain * spread)):
                torch.mm(self.a, self.b)
        return self.head(torch.relu(self.conv(x)).flatten(1))


def build() -> Workload:
    torch.manual_seed(0)
    model = _Filler(int(os.environ["CLOSE_CALL_PRODUCTS"]), float(os.environ["CLOSE_CALL_GAIN"]),
                    float(os.environ["CLOSE_CALL_NOISE"]))
    return Workload(model, (torch.randn(16, 3, 16, 16), torch.randint(0, 10, (16,))), cross_entropy)


def _products_for(step_ms: float) -> int:
    """How many filler products take ``step_ms`` on one thread here."""
    a, b = torch.randn(_SIZE, _SIZE), torch.randn(_SIZE, _SIZE)
    for _ in range(200):
        torch.mm(a, b)
    start = time.perf_counter()
    for _ in range(2000):
        torch.mm(a, b)
    return max(1, round(step_ms / ((time.perf_counter() - start) * 1000 / 2000)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--gain", type=float, default=0.045)
    parser.add_argument("--noise", type=float, default=0.08)
    parser.add_argument("--step-ms", type=float, default=8.0)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    runs = 2 if args.quick else args.runs
    os.environ["AUTOTUNE_CACHE_DIR"] = tempfile.mkdtemp(prefix="autotune-bench-")
    os.environ.update(CLOSE_CALL_PRODUCTS=str(_products_for(args.step_ms)), CLOSE_CALL_GAIN=str(args.gain),
                      CLOSE_CALL_NOISE=str(args.noise))
    register_family("close_call", "close_call:build", version=f"{args.gain}-{args.noise}")
    right = 0
    for run in range(runs):
        load = os.getloadavg()[0]
        start = time.perf_counter()
        measured = measure_family("close_call")
        pick = picked(measured)
        layout = "channels_last" if "channels_last" in pick.label else "contiguous"
        right += layout == "channels_last"
        emit({"bench": "close_call", "run": run, "pick": pick.label, "right": layout == "channels_last",
              "noisy": measured.noisy, "calibration_s": round(time.perf_counter() - start, 1),
              "load_before": round(load, 2), "load_after": round(os.getloadavg()[0], 2)})
    emit({"bench": "close_call", "summary": True, "gain": args.gain, "noise": args.noise, "step_ms": args.step_ms,
          "products": int(os.environ["CLOSE_CALL_PRODUCTS"]), "right": right, "runs": runs,
          "cpu": _cpu(), "threads": torch.get_num_threads()})


def _cpu() -> str:
    with open("/proc/cpuinfo") as info:
        return next((line.split(":", 1)[1].strip() for line in info if line.startswith("model name")), "unknown")


if __name__ == "__main__":
    main()
