"""The loop end to end on an image pipeline: a built-in family's training as ``best_config`` chose it, fed by a
DataLoader over PNG files decoded with Pillow, at ``num_workers=0``, at a tutorial's settings, at Lightning's
suggestion and with ``cfg.dataloader_kwargs``, interleaved in one run, beside the chosen precision's per-step
speed-up over fp32: the step's gain next to the loop's.

The images are ``--images`` PNG files of 192-320 pixels a side (smooth colour fields, shapes and noise), written into
a temporary folder. Each sample is decoded with Pillow, cropped at random to 8-100% of its area at an aspect ratio of
3/4-4/3 and resized to the family's input size, flipped left to right half the time, and normalised: torchvision's
``RandomResizedCrop`` and ``RandomHorizontalFlip``, written with Pillow and torch (torchvision is not needed).

The DataLoader settings, each with ``shuffle=True`` and, with workers, ``persistent_workers=True`` (the comparison is
of settings, not of worker restarts at a small dataset's frequent epoch ends):

- ``num_workers=0``: DataLoader's default;
- ``tutorial``: ``num_workers=4, pin_memory=True``, what pytorch/examples' ImageNet training (``imagenet/main.py``)
  passes with this crop and flip;
- ``lightning``: the count Lightning's warning suggests (``suggested_max_num_workers``: the usable cores - 1);
- ``dataloader_kwargs``: autotune's answer for this Config and dataset, with the training threads it measured with.

The per-step speed-up is fp32's step time over the pick's on the pick's device (default variants), from the
calibration's paired evidence as the Config's reason words it (the estimate, or its interval's low end where that is
wide; the medians where the pairing breaks). Where the pick is more than fp32 with other threads, every setting also
trains an fp32 copy, and its row gives the loop's paired speed-up over that copy: a loop that waits for its data
keeps little of what the step gained. Each round times a block of steps of every arm, in an order rotated from round
to round, after draining the batches its workers prefetched while the others ran; ratios are paired by round with
95% intervals. The guard's data-wait share (``guard.data``) is printed for each.

    pip install -e '.[bench]'                  # Pillow
    python benchmarks/loader.py [--kind cnn] [--batch-size 32] [--images 512] [--rounds 12] [--steps 8]
    python benchmarks/loader.py --quick        # a short run that checks the script works, not a figure

Goal: the ``dataloader_kwargs`` loop >= 0.95x the best of the four.
"""

from __future__ import annotations

import argparse
import itertools
import math
import os
import tempfile
import time
from collections.abc import Generator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from _common import emit
from PIL import Image, ImageDraw
from torch.utils.data import DataLoader, Dataset

import autotune
from autotune import _stats
from autotune._families import get_family
from autotune._records import Candidate
from autotune._wording import headline, times_over
from autotune.backends import backend_for

MEAN = torch.tensor([0.485, 0.456, 0.406]).view(3, 1, 1)
STD = torch.tensor([0.229, 0.224, 0.225]).view(3, 1, 1)


class Photos(Dataset[tuple[torch.Tensor, int]]):
    """PNG files decoded with Pillow, each a random-resized crop to ``size`` x ``size``, flipped half the time,
    normalised with ImageNet's mean and deviation; ten classes."""

    def __init__(self, paths: list[Path], size: int) -> None:
        self.paths = paths
        self.size = size

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        with Image.open(self.paths[index]) as file:
            image = file.convert("RGB")
        image = image.resize((self.size, self.size), Image.Resampling.BILINEAR, box=_crop_box(*image.size))
        if torch.rand(()) < 0.5:
            image = image.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        pixels = torch.from_numpy(np.array(image)).permute(2, 0, 1).float().div_(255)
        return (pixels - MEAN) / STD, index % 10


def _crop_box(width: int, height: int) -> tuple[int, int, int, int]:
    """torchvision's ``RandomResizedCrop.get_params`` (scale 0.08-1, ratio 3/4-4/3) as a Pillow box: ten tries at a
    random area and log-uniform aspect, else the centre at the nearest allowed aspect."""
    area = width * height
    for _ in range(10):
        target = area * float(torch.empty(()).uniform_(0.08, 1.0))
        aspect = math.exp(float(torch.empty(()).uniform_(math.log(3 / 4), math.log(4 / 3))))
        w, h = round(math.sqrt(target * aspect)), round(math.sqrt(target / aspect))
        if 0 < w <= width and 0 < h <= height:
            left = int(torch.randint(0, width - w + 1, ()))
            top = int(torch.randint(0, height - h + 1, ()))
            return left, top, left + w, top + h
    if width / height > 4 / 3:
        w, h = round(height * 4 / 3), height
    elif width / height < 3 / 4:
        w, h = width, round(width * 4 / 3)
    else:
        w, h = width, height
    left, top = (width - w) // 2, (height - h) // 2
    return left, top, left + w, top + h


def _write_images(folder: Path, count: int) -> list[Path]:
    """``count`` PNG files of 192-320 pixels a side, each made from its index: a smooth colour field, a few
    rectangles and ellipses, noise (a photo's mix of flat areas and texture, so PNG compresses it as it would one)."""
    paths = []
    for index in range(count):
        rng = np.random.default_rng(index)
        width, height = (int(v) for v in rng.integers(192, 321, 2))
        field = Image.fromarray(rng.integers(0, 256, (4, 4, 3), dtype=np.uint8)).resize((width, height),
                                                                                        Image.Resampling.BICUBIC)
        draw = ImageDraw.Draw(field)
        for _ in range(int(rng.integers(2, 7))):
            x0, x1 = sorted(int(v) for v in rng.integers(0, width, 2))
            y0, y1 = sorted(int(v) for v in rng.integers(0, height, 2))
            shape = draw.ellipse if rng.random() < 0.5 else draw.rectangle
            shape((x0, y0, x1, y1), fill=tuple(int(v) for v in rng.integers(0, 256, 3)))
        noisy = np.asarray(field, dtype=np.int16) + rng.normal(0, 8, (height, width, 3)).astype(np.int16)
        path = folder / f"{index:05d}.png"
        Image.fromarray(noisy.clip(0, 255).astype(np.uint8)).save(path)
        paths.append(path)
    return paths


class Arm:
    """One DataLoader setting with one Config and the training threads it runs with: its own model, optimizer,
    GradScaler and guard."""

    def __init__(self, setting: str, config: autotune.Config, dataset: Photos, kwargs: dict[str, Any],
                 threads: int) -> None:
        self.setting = setting
        self.config = config
        self.kwargs = kwargs
        self.threads = threads
        torch.manual_seed(0)
        workload = get_family(config.model_kind).build()
        self.model, self.optimizer = config.prepare(workload.model, workload.optimizer)
        self.scaler = config.grad_scaler()
        self.loss = workload.loss
        self.guard = autotune.Guard(config.model_kind, config.candidate, config.fingerprint_digest,
                                    step_ms=config.step_ms)
        self.backend = backend_for(config.device)
        self.stream = _forever(DataLoader(dataset, **kwargs))
        self.samples_per_s: list[float] = []

    def block(self, steps: int) -> None:
        """Drain what the workers prefetched meanwhile, then time ``steps`` training steps, a pass of the guard's
        (what it keeps at a pass's end is written after the last step's time is taken)."""
        torch.set_num_threads(self.threads)
        self.config.apply_precision()
        prefetched = self.kwargs.get("num_workers", 0) * self.kwargs.get("prefetch_factor", 2)
        for batch in itertools.islice(self.stream, prefetched + 1):
            self._step(batch)
        self.backend.synchronize(self.config.device)
        started = ended = time.perf_counter()
        samples = 0
        for batch in self.guard.data(itertools.islice(self.stream, steps)):
            samples += self._step(batch)
            self.backend.synchronize(self.config.device)
            ended = time.perf_counter()
        self.samples_per_s.append(samples / (ended - started))

    def _step(self, batch: Any) -> int:
        images, labels = self.config.prepare_batch(batch)
        with self.config.autocast():
            loss = self.loss(self.model, (images, labels))
        self.optimizer.zero_grad(set_to_none=True)
        self.scaler.scale(loss).backward()
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.guard.step(loss)
        return len(labels)


def _forever(loader: DataLoader[Any]) -> Generator[Any, None, None]:
    """Epoch after epoch; closing it ends the loader's workers."""
    while True:
        yield from loader


def _fp32_twin(config: autotune.Config) -> autotune.Config | None:
    """fp32 on the pick's device with default variants, as a Config; None where the pick differs from it in its
    thread count alone (each loader setting trains with its own threads)."""
    fp32 = Candidate(device=config.device, precision="fp32")
    if config.candidate.model_copy(update={"num_threads": None}) == fp32:
        return None
    return autotune.Config(**fp32.model_dump(), model_kind=config.model_kind, source="measured",
                           reason="benchmark: fp32 beside the pick", fingerprint_digest=config.fingerprint_digest)


def _step_speedup(config: autotune.Config) -> tuple[float | None, str]:
    """fp32's step time over the pick's, on the pick's device, from the calibration, as its reason words it (the
    paired estimate, or its interval's low end where that is wide); with where it came from."""
    fp32 = Candidate(device=config.device, precision="fp32")
    if config.candidate == fp32:
        return 1.0, "the pick is fp32"
    evidence = config.evidence
    rival = next((r for r in evidence.rivals if r.candidate == fp32), None) if evidence is not None else None
    if evidence is None or rival is None:
        return None, f"{fp32.label} not in the calibration's evidence"
    claim = headline(rival, config.candidate, evidence)
    if claim is not None:
        return claim[0], f"paired rounds, {'a lower bound' if claim[1] else 'the estimate'} ({rival.verdict})"
    paired = times_over(rival, config.candidate, evidence)
    if paired is not None:
        return paired, f"paired rounds, an estimate with a wide interval ({rival.verdict})"
    if rival.step_ms and config.step_ms:
        return rival.step_ms / config.step_ms, f"median step times ({rival.verdict})"
    return None, f"{fp32.label}: {rival.verdict}"


def _load_ms(dataset: Photos, batch_size: int) -> float:
    """A batch's decoding and transforms on one thread, in ms."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        dataset[0]
        started = time.perf_counter()
        for index in range(batch_size):
            dataset[index % len(dataset)]
        return (time.perf_counter() - started) * 1000
    finally:
        torch.set_num_threads(threads)


def _lightning_workers() -> tuple[int, str]:
    """What Lightning's warning suggests for one process, and where the figure came from."""
    try:
        from lightning.fabric.utilities.data import suggested_max_num_workers
    except ImportError:
        return max(1, (os.cpu_count() or 1) - 1), "cpu_count - 1 (Lightning's rule; Lightning not installed)"
    return suggested_max_num_workers(1), "lightning.fabric.utilities.data.suggested_max_num_workers(1)"


def _interval(samples: list[float], against: list[float]) -> dict[str, Any]:
    ratio, low, high = _stats.ratio_interval(samples, against, alpha=0.025)
    return {"estimate": round(ratio, 3), "interval": [round(low, 3), round(high, 3)]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kind", default="cnn", help="a built-in family whose inputs are 3-channel square images")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--images", type=int, default=512, help="PNG files in the dataset")
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--steps", type=int, default=8, help="timed steps per block")
    parser.add_argument("--quick", action="store_true",
                        help="64 images, 2 rounds of 3 steps, a 1 s calibration of precisions alone: checks it runs")
    args = parser.parse_args()
    if args.quick:
        args.images, args.rounds, args.steps = 64, 2, 3
        os.environ.setdefault("AUTOTUNE_BUDGET_S", "1")
        os.environ.setdefault("AUTOTUNE_SEARCH", "precision")
    inputs = get_family(args.kind).build(1).inputs[0]
    if inputs.dim() != 4 or inputs.shape[1] != 3 or inputs.shape[2] != inputs.shape[3]:
        parser.error(f"{args.kind}'s inputs are {tuple(inputs.shape)}, not 3-channel square images")
    size = int(inputs.shape[-1])
    with tempfile.TemporaryDirectory() as cache, tempfile.TemporaryDirectory() as folder:
        os.environ["AUTOTUNE_CACHE_DIR"] = cache  # a fresh answer, measured in this run; yours stay as they are
        started = time.perf_counter()
        dataset = Photos(_write_images(Path(folder), args.images), size)
        written_s = time.perf_counter() - started
        started = time.perf_counter()
        config = autotune.best_config(args.kind)
        calibrated_s = time.perf_counter() - started
        threads = config.num_threads or torch.get_num_threads()
        step_speedup, step_speedup_from = _step_speedup(config)
        started = time.perf_counter()
        tuned = config.dataloader_kwargs(dataset, batch_size=args.batch_size, shuffle=True)
        measured_s = time.perf_counter() - started
        report = config.dataloader_report(dataset, batch_size=args.batch_size, shuffle=True)
        tuned_threads = report.num_threads or threads  # measured with fewer than the config's, else with its own
        load_ms = _load_ms(dataset, args.batch_size)
        lightning, lightning_from = _lightning_workers()
        batching = {"batch_size": args.batch_size, "shuffle": True}
        settings = {
            "num_workers=0": ({**batching, "num_workers": 0}, threads),
            "tutorial": ({**batching, "num_workers": 4, "pin_memory": True, "persistent_workers": True}, threads),
            "lightning": ({**batching, "num_workers": lightning, "persistent_workers": True}, threads),
            "dataloader_kwargs": (tuned, tuned_threads),
        }
        twin = _fp32_twin(config)
        arms = {(name, label): Arm(name, chosen, dataset, kwargs, count)
                for name, (kwargs, count) in settings.items()
                for label, chosen in (("pick", config), ("fp32", twin)) if chosen is not None}
        emit({"benchmark": "loader", "kind": args.kind, "pick": config.candidate.label, "reason": config.reason,
              "noisy": config.noisy, "calibrate_s": round(calibrated_s, 1), "step_ms": config.step_ms,
              "per_step_vs_fp32": None if step_speedup is None else round(step_speedup, 3),
              "per_step_vs_fp32_from": step_speedup_from, "speedup_vs_fp32_cpu": config.speedup_vs_fp32_cpu,
              "images": args.images, "image_size": size, "write_images_s": round(written_s, 1),
              "batch_size": args.batch_size, "load_ms_per_batch_one_thread": round(load_ms, 1),
              "cpu_count": os.cpu_count(), "config_threads": threads, "lightning_from": lightning_from,
              "tuned_reason": report.reason, "tuned_threads": tuned_threads, "measure_s": round(measured_s, 2),
              "measure_wall_s": round(report.wall_s, 2), "budget_s": report.budget_s,
              "fp32_arms": twin is not None})
        order = list(arms.values())
        for round_index in range(args.rounds):
            shift = round_index % len(order)
            for arm in order[shift:] + order[:shift]:
                arm.block(args.steps)
        best = max(settings, key=lambda name: _stats.median(arms[name, "pick"].samples_per_s))
        mine = arms["dataloader_kwargs", "pick"].samples_per_s
        for name in settings:
            arm = arms[name, "pick"]
            fp32_arm = arms.get((name, "fp32"))
            emit({"benchmark": "loader", "setting": name,
                  "kwargs": {k: v for k, v in arm.kwargs.items() if k not in batching}, "threads": arm.threads,
                  "samples_per_s": round(_stats.median(arm.samples_per_s), 1),
                  "per_step_vs_fp32": None if step_speedup is None else round(step_speedup, 3),
                  "loop_vs_fp32": None if fp32_arm is None else _interval(arm.samples_per_s, fp32_arm.samples_per_s),
                  "fp32_samples_per_s": None if fp32_arm is None else round(_stats.median(fp32_arm.samples_per_s), 1),
                  "guard_data_wait_share": round(arm.guard.summary().data_wait_share or 0.0, 3),
                  "tuned_over_this": _interval(mine, arm.samples_per_s)})
        vs_best = _interval(mine, arms[best, "pick"].samples_per_s)
        emit({"benchmark": "loader", "summary": True, "rounds": args.rounds, "steps_per_block": args.steps,
              "best": best, "tuned_over_best": vs_best,
              "goal_within_5pct_of_best": vs_best["estimate"] >= 0.95, "quick": args.quick})
        for arm in arms.values():
            arm.stream.close()


if __name__ == "__main__":
    main()
