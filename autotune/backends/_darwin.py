"""macOS facts for the fingerprint, read with one ``sysctl`` call (no device is touched).

Kept apart from the backends so the parsing can be tested on recorded output.
"""

from __future__ import annotations

import subprocess

#: what the fingerprint reads: the CPU's name and whether it has the Armv8.6 BF16 instructions (M2 and later)
SYSCTL_NAMES = ("machdep.cpu.brand_string", "hw.optional.arm.FEAT_BF16")


def read_sysctl(names: tuple[str, ...] = SYSCTL_NAMES) -> dict[str, str]:
    """``sysctl NAME...`` parsed; a name this macOS does not know is simply absent."""
    try:
        # An unknown name makes sysctl exit non-zero after printing the known ones: no check=True.
        out = subprocess.run(["sysctl", *names], capture_output=True, text=True, timeout=5, check=False).stdout
    except (OSError, subprocess.SubprocessError):
        return {}
    return parse_sysctl(out)


def parse_sysctl(text: str) -> dict[str, str]:
    """``'machdep.cpu.brand_string: Apple M1\\n'`` -> ``{'machdep.cpu.brand_string': 'Apple M1'}``"""
    values: dict[str, str] = {}
    for line in text.splitlines():
        name, sep, value = line.partition(":")
        if sep and name.strip():
            values[name.strip()] = value.strip()
    return values


def apple_cpu(values: dict[str, str], machine: str) -> tuple[str, set[str]]:
    """The CPU brand and ISA flags from sysctl values, e.g. ``('Apple M2', {'neon', 'bf16'})``."""
    flags = {"neon"} if machine == "arm64" else set()
    if values.get("hw.optional.arm.FEAT_BF16") == "1":
        flags.add("bf16")
    return values.get("machdep.cpu.brand_string", ""), flags


__all__ = ["SYSCTL_NAMES", "apple_cpu", "parse_sysctl", "read_sysctl"]
