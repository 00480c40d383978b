"""Memory probes: how much memory the device a job runs on has free *right now*.

A probe answers one question, ``read() -> MemoryReading(total, free, source)``, for one device,
counting memory taken by **other processes** too (co-tenants on a shared GPU, other jobs in the
same host or container). A memory-aware callback polls a probe to raise or lower its compression.

Probes, best first (each in its own module; this one picks among them):

* :class:`NVMLProbe` (``nvml.py``) -- NVIDIA's management library (``pynvml`` from
  ``nvidia-ml-py``). Whole device memory as the driver sees it; the CUDA device is matched to
  its NVML handle by UUID (NVML ignores ``CUDA_VISIBLE_DEVICES`` and orders devices by PCI
  bus), MIG instances included.
* :class:`CudaProbe` (``cuda.py``) -- ``torch.cuda.mem_get_info`` (also device-wide), the
  fallback when NVML cannot be used (no ``libnvidia-ml`` in the container, unified-memory
  GPUs, ...).
* :class:`HostMemoryProbe` (``host.py``) -- CPU jobs: ``/proc/meminfo`` bounded by the
  process's cgroup limit.
* :class:`ScriptedProbe` (``scripted.py``) -- a replayed or synthetic trace, for tests and
  simulations.

Readings, the error and the base class are in ``protocol.py``; a budget shared with other
processes, read as a probe, in ``budget.py``.

:func:`auto_probe` picks the best that works for a device. Probes never crash training: every
failure to measure is a :class:`ProbeUnavailable`, from construction or from ``read()``.

Example:
    >>> from lightning_bandlimit.memory.scripted import ScriptedProbe
    >>> with ScriptedProbe([6_000, 2_500], total=8_000) as probe:
    ...     first, second = probe.read(), probe.read()
    >>> first.free, second.used, second.free_fraction
    (6000, 5500, 0.3125)
"""

from __future__ import annotations

import warnings

import torch

from lightning_bandlimit.memory._torch import as_device
from lightning_bandlimit.memory.cuda import CudaProbe
from lightning_bandlimit.memory.host import HostMemoryProbe
from lightning_bandlimit.memory.nvml import NVMLProbe
from lightning_bandlimit.memory.protocol import MemoryProbe, ProbeUnavailable

__all__ = ["auto_probe"]


def _warn(message: str) -> None:
    warnings.warn(message, UserWarning, stacklevel=3)


def auto_probe(device: torch.device | str | int | None = None) -> MemoryProbe | None:
    """The best probe that works for ``device``, or ``None`` when none does.

    CUDA devices get an :class:`NVMLProbe`, else a :class:`CudaProbe`; CPU gets a
    :class:`HostMemoryProbe`. Each fallback emits exactly one ``UserWarning`` saying why: one
    when NVML fails and CUDA works, one (naming both failures) when neither works, one when the
    host probe fails; ``None`` then means "do not adapt to memory". Never raises
    :class:`ProbeUnavailable`.

    Args:
        device: ``torch.device``, string (``"cuda:1"``, ``"cpu"``) or CUDA index. ``None``: the
            current CUDA device if CUDA is available, else the CPU.

    Returns:
        An open probe (close it when done), or ``None``.

    Raises:
        ValueError: if ``device`` is a string that names no device.
        TypeError: if ``device`` has another type.

    Example:
        >>> probe = auto_probe("cpu")  # Linux: /proc/meminfo and the cgroup limit
        >>> probe.source, probe.read().free > 0
        ('host', True)
        >>> probe.close()
    """
    dev = as_device(device)
    if dev is None:
        dev = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    if dev.type == "cuda":
        try:
            return NVMLProbe(dev)
        except ProbeUnavailable as err:
            nvml_error = err
        try:
            probe = CudaProbe(dev)
        except ProbeUnavailable as cuda_error:
            _warn(
                f"No memory probe for {dev}: NVML failed ({nvml_error}) and torch.cuda.mem_get_info "
                f"failed ({cuda_error}); memory-aware adaptation is disabled."
            )
            return None
        _warn(
            f"NVML memory probe unavailable for {dev} ({nvml_error}); falling back to "
            "torch.cuda.mem_get_info (also counts other processes' memory, but keeps a CUDA context "
            "on the device)."
        )
        return probe
    if dev.type == "cpu":
        try:
            return HostMemoryProbe()
        except ProbeUnavailable as err:
            _warn(f"No host memory probe ({err}); memory-aware adaptation is disabled.")
            return None
    _warn(f"No memory probe for device type {dev.type!r} ({dev}); memory-aware adaptation is disabled.")
    return None
