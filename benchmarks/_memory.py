"""Memory figures of the current process from the kernel (Linux `/proc`), shared by the benchmarks."""

from __future__ import annotations


def status_kib(field: str) -> int:
    """A `/proc/self/status` field in KiB: `VmRSS` (resident now) or `VmHWM` (its high-water mark)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")
