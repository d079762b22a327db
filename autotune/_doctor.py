"""``python -m autotune --doctor``: GPU hardware this torch build cannot use, and settings that skew timing.

It runs in the CLI's own process, so unlike the library's host path it may initialise devices.
"""

from __future__ import annotations

from autotune.backends import Finding, all_backends


def diagnose() -> list[Finding]:
    """Each usable accelerator, then what each backend finds wrong here; the CPU when no GPU is usable."""
    cpu, *accelerators = all_backends()
    findings: list[Finding] = []
    usable = []
    for backend in accelerators:
        reason = backend.unusable_reason()
        if reason is None:
            names = [backend.device_name(d) for d in backend.devices()]
            usable += names
            findings += [Finding(level="ok", message=f"{backend.name}: {name}") for name in names]
    for backend in all_backends():
        findings += backend.diagnose()
    if not usable:
        findings.append(Finding(
            level="info",
            message=f"no usable GPU on this machine: training runs on the CPU ({cpu.device_name('cpu')})",
        ))
    return findings


__all__ = ["Finding", "diagnose"]
