"""What identifies this machine's training speed, and nothing that identifies its user.

No hostname, user name, serial number, UUID or MAC address is stored (GPU UUIDs are read only to match
``CUDA_VISIBLE_DEVICES``). The digest is a hash of the canonical JSON of the fields, so any change in them (a
GPU swap, a torch upgrade, a ``taskset`` or a container's CPU quota with fewer cores, another
``CUDA_VISIBLE_DEVICES`` or ``OMP_NUM_THREADS``) selects a different results file, and swapping back finds the old
one again.

The machine and the budget a process starts with are read once per process: what the process then sets itself
(``torch.set_num_threads``, which ``Config.apply_threads`` and ``dataloader_kwargs`` call too) never moves the
digest, so an answer, its demotions and the guard's fallback stay on one results file for the whole run. A
candidate without a thread count of its own is measured with torch's default for the environment
(:func:`default_threads`), which the fields determine.

Left out on purpose: the kernel's patch level (only major.minor is kept) and process settings the calibration
worker does not apply, such as ``torch.set_float32_matmul_precision`` (the worker sets each candidate's own).
What a single family's measurements depend on (its build, the search, the budget) is the family's key, not
the machine's: see ``_cache.freshness``.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import platform
import re
import sys

import torch
from pydantic import computed_field

from autotune._quota import allowance
from autotune._records import Record
from autotune.backends import Accelerator, _windows, all_backends
from autotune.backends.cpu import cpu_facts

#: Environment variables that set the CPU thread pools of the worker (it inherits the environment).
THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")
#: The processes of one job sharing this machine (torchrun's name), in ``environment`` when more than one: a CPU
#: candidate is timed with that many copies of its step running at once, an answer no single process should read.
PROCESSES_VARIABLE = "LOCAL_WORLD_SIZE"
#: which fields the digest covers: 2 since torch's thread count of the moment was left out and the CPU quota came
#: in (records written before hold none: 1), so an older record is never taken for this machine's own
REVISION = 2


@functools.cache
def device_variables() -> tuple[str, ...]:
    """Environment variables that choose which accelerators the worker sees, and in which order: each
    backend's ``visible_device_variables``, e.g. ``CUDA_VISIBLE_DEVICES``."""
    return tuple(name for backend in all_backends() for name in backend.visible_device_variables)


class Fingerprint(Record):
    """The machine, e.g. ``cpu_brand='AMD EPYC', usable_cores=2, accelerators=[]``; ``digest`` keys the cache."""

    os: str
    os_release: str
    arch: str
    python: str
    torch: str
    cuda: str | None
    hip: str | None
    cudnn: int | None
    cpu_brand: str
    cpu_isa: list[str]
    cpu_capability: str
    #: the cores this process may keep busy: its affinity, fewer where its cgroup's CPU quota allows fewer
    usable_cores: int
    #: cores' worth of CPU time its control groups allow, e.g. 1.5 (``docker run --cpus 1.5``); None: no limit
    cpu_quota: float | None = None
    ram_gib: int
    accelerators: list[Accelerator]
    #: the set ones of device_variables() and THREAD_VARIABLES, e.g. ``{'OMP_NUM_THREADS': '1'}``, and in a job the
    #: processes sharing this machine (PROCESSES_VARIABLE), e.g. ``{'LOCAL_WORLD_SIZE': '2'}``
    environment: dict[str, str]
    #: which fields the digest covers (REVISION); 1 in records written before it was kept
    revision: int = 1

    @computed_field  # type: ignore[prop-decorator]
    @functools.cached_property
    def digest(self) -> str:
        """16 hex digits of SHA-256 over the canonical JSON of every field above."""
        canonical = json.dumps(self.model_dump(exclude={"digest"}), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()[:16]

    @property
    def processes(self) -> int:
        """The processes of one job that share this machine and were measured running at once, e.g. 2; 1 alone."""
        return int(self.environment.get(PROCESSES_VARIABLE, "1"))

    def summary(self) -> str:
        gpus = ", ".join(f"{a.name} ({a.backend})" for a in self.accelerators) or "no GPU"
        return (
            f"{self.cpu_brand}, {self.usable_cores} cores, {self.ram_gib} GiB; {gpus}; "
            f"torch {self.torch}, Python {self.python}, {self.os} {self.arch}"
        )


def kernel_release(release: str) -> str:
    """Major.minor of an OS release: ``'6.8.0-45-generic'`` -> ``'6.8'``; ``'10'`` (Windows) stays ``'10'``."""
    match = re.match(r"(\d+)\.(\d+)", release)
    return f"{match[1]}.{match[2]}" if match else release


def _ram_gib() -> int:
    if sys.platform == "win32":
        total = _windows.ram_bytes()
    else:
        try:
            total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        except (ValueError, OSError):  # a name this system does not know
            total = 0
    return max(1, round(total / 2**30))


@functools.cache
def _static_fields() -> dict[str, object]:
    brand, isa = cpu_facts()
    cudnn = None
    if torch.version.cuda is not None and torch.backends.cudnn.is_available():  # neither initialises CUDA
        cudnn = torch.backends.cudnn.version()
    return {
        "os": platform.system(),
        "os_release": kernel_release(platform.release()),
        "arch": platform.machine(),
        "python": f"{sys.version_info.major}.{sys.version_info.minor}",
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "hip": torch.version.hip,
        "cudnn": cudnn,
        "cpu_brand": brand,
        "cpu_isa": list(isa),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "ram_gib": _ram_gib(),
    }


@functools.lru_cache(maxsize=8)
def _accelerators(device_environment: tuple[tuple[str, str], ...]) -> tuple[Accelerator, ...]:
    # Keyed by the visible-device variables: the backends read them to list what the worker will see.
    return tuple(a for backend in all_backends() for a in backend.host_accelerators())


@functools.cache
def default_threads() -> int:
    """torch's intra-op thread count when this process first asked, e.g. 8: what a candidate without a count of its
    own is measured with. The worker, a fresh process, asks before anything sets it: torch's default for the
    environment (``OMP_NUM_THREADS``, ``MKL_NUM_THREADS``, the cores), which the fingerprint holds. This process
    asks when it first reads its fingerprint, before ``apply_threads`` or ``dataloader_kwargs`` set their own."""
    return torch.get_num_threads()


@functools.cache
def _budget() -> tuple[int, float | None, tuple[tuple[str, str], ...]]:
    """What this process started with: the cores it may keep busy, its CPU quota in cores' worth of time, and the
    set device and thread variables."""
    default_threads()
    environment = tuple((name, value) for name in (*device_variables(), *THREAD_VARIABLES)
                        if (value := os.environ.get(name)) is not None)
    allowed = allowance()
    return allowed.cores, allowed.quota.cores if allowed.quota is not None else None, environment


@functools.lru_cache(maxsize=8)
def fingerprint(*, processes: int = 1) -> Fingerprint:
    """This machine's fingerprint, read once per process.

    ``processes``: the processes of one job that share this machine, each running its own training steps (a
    job's answer is measured for them, and kept apart from a single process's)."""
    usable_cores, cpu_quota, environment = _budget()
    if processes > 1:
        environment = (*environment, (PROCESSES_VARIABLE, str(processes)))
    devices = tuple(pair for pair in environment if pair[0] in device_variables())
    return Fingerprint.model_validate({
        **_static_fields(), "usable_cores": usable_cores, "cpu_quota": cpu_quota,
        "accelerators": list(_accelerators(devices)), "environment": dict(environment), "revision": REVISION,
    })


def forget() -> None:
    """Read the budget again at the next call, as a new process would (tests: ``autotune.testing.reset_state``);
    the hardware stays as read."""
    fingerprint.cache_clear()
    _budget.cache_clear()
    default_threads.cache_clear()


__all__ = ["PROCESSES_VARIABLE", "REVISION", "THREAD_VARIABLES", "Fingerprint", "default_threads", "device_variables",
           "fingerprint", "forget", "kernel_release"]
