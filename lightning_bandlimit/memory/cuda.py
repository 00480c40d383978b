"""The torch.cuda probe: a CUDA device's free memory from ``torch.cuda.mem_get_info``.

The fallback when NVML cannot be used (no ``libnvidia-ml`` in the container, unified-memory
GPUs, ...). Device-wide like NVML, but it keeps a CUDA context on the device.
"""

from __future__ import annotations

import torch

from lightning_bandlimit.memory._torch import as_device, cuda_index
from lightning_bandlimit.memory.protocol import MemoryProbe, MemoryReading, ProbeUnavailable, describe_error

__all__ = ["CudaProbe"]


class CudaProbe(MemoryProbe):
    """Free memory of a CUDA device from ``torch.cuda.mem_get_info`` (``cudaMemGetInfo``).

    Like NVML this is device-wide, so other processes' memory is counted; on a MIG instance it
    is the instance's memory. It needs a CUDA context on the device (created on first use).
    Construction reads once, so a device that cannot be measured fails here.

    Args:
        device: the CUDA device (``torch.device``, ``"cuda:1"`` or an index); ``None`` or a
            device without index means the current CUDA device.

    Raises:
        ProbeUnavailable: if CUDA is not available or ``mem_get_info`` fails.
        ValueError: if ``device`` is not a CUDA device.

    Example:
        >>> probe = CudaProbe(0)  # doctest: +SKIP
        >>> probe.read().source  # doctest: +SKIP
        'cuda'
    """

    source = "cuda"

    def __init__(self, device: torch.device | str | int | None = None) -> None:
        dev = as_device(device)
        if dev is not None and dev.type != "cuda":
            raise ValueError(f"CudaProbe measures CUDA devices, got {dev}")
        if not torch.cuda.is_available():
            raise ProbeUnavailable("CUDA is not available (torch.cuda.is_available() is False)")
        self.index: int = cuda_index(dev, "CudaProbe")
        self.device = torch.device("cuda", self.index)
        self.read()

    def read(self) -> MemoryReading:
        """Device-wide memory now.

        Returns:
            A :class:`MemoryReading` with ``source="cuda"``.

        Raises:
            ProbeUnavailable: if ``torch.cuda.mem_get_info`` fails or the probe is closed.
        """
        self._ensure_open()
        try:
            free, total = torch.cuda.mem_get_info(self.index)
            free, total = int(free), int(total)
        except Exception as err:
            raise ProbeUnavailable(
                f"torch.cuda.mem_get_info({self.device}) failed: {describe_error(err)}"
            ) from err
        total = max(total, 0)
        return MemoryReading(total=total, free=min(max(free, 0), total), source=self.source)

    def __repr__(self) -> str:
        return f"CudaProbe({self.device}, closed={self._closed})"
