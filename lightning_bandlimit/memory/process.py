"""A process's own memory as the operating system sees it, and giving cached memory back.

On Linux, ``/proc/<pid>/status`` has the resident set (``VmRSS``) and its high-water mark
(``VmHWM``), which writing ``5`` to ``/proc/<pid>/clear_refs`` resets: together they measure the
peak of one training step. Freed memory stays resident when an allocator caches it (PyTorch's
CUDA caching allocator; glibc's heap on the host), so a job that shrinks must also hand its
cache back for others to see the memory free: :func:`release_cached_memory`.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
from pathlib import Path

import torch

__all__ = [
    "peak_resident_bytes",
    "release_cached_memory",
    "reset_peak_resident",
    "resident_bytes",
]


def _status_field(pid: int | None, field: str) -> int:
    path = Path(f"/proc/{'self' if pid is None else pid}/status")
    try:
        text = path.read_text()
    except OSError as error:
        raise OSError(f"cannot read {path} ({error}); process memory is read from Linux's /proc") from error
    for line in text.splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise OSError(f"{path} has no {field} line")


def resident_bytes(pid: int | None = None) -> int:
    """Resident set size of process ``pid`` (default: this process), in bytes.

    Raises:
        OSError: when ``/proc/<pid>/status`` cannot be read (not Linux, or no such process).

    Example:
        >>> resident_bytes() > 0
        True
    """
    return _status_field(pid, "VmRSS")


def peak_resident_bytes(pid: int | None = None) -> int:
    """High-water mark of the resident set since start or the last :func:`reset_peak_resident`.

    Raises:
        OSError: when ``/proc/<pid>/status`` cannot be read.
    """
    return _status_field(pid, "VmHWM")


def reset_peak_resident(pid: int | None = None) -> bool:
    """Reset the resident high-water mark to the current resident size; ``False`` if not allowed."""
    try:
        Path(f"/proc/{'self' if pid is None else pid}/clear_refs").write_text("5")
    except OSError:
        return False
    return True


@functools.cache
def _libc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
    except OSError:
        return None
    return libc if libc is not None and hasattr(libc, "malloc_trim") else None


def release_cached_memory(device: torch.device | None = None) -> None:
    """Give memory the allocators keep for reuse back to the device or the operating system.

    CUDA: ``torch.cuda.empty_cache()`` (so NVML and other processes see it free). Host: glibc's
    ``malloc_trim(0)``, where the C library has it. A no-op elsewhere.

    Example:
        >>> release_cached_memory(torch.device("cpu"))
    """
    if device is not None and device.type == "cuda":
        torch.cuda.empty_cache()
        return
    libc = _libc()
    if libc is not None:
        libc.malloc_trim(0)
