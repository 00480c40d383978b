"""What the memory probes ask torch about CUDA devices, in one place.

``cuda_device_uuid`` reads the ``uuid`` field of ``torch.cuda.get_device_properties``, an
undocumented field of torch's private ``torch._C._CudaDeviceProperties``;
``tests/memory/test_torch_adapter.py`` checks that the installed torch still has it.
"""

from __future__ import annotations

import torch

from lightning_bandlimit.memory.protocol import ProbeUnavailable, describe_error

__all__ = ["as_device", "cuda_device_uuid", "cuda_index"]


def as_device(device: torch.device | str | int | None) -> torch.device | None:
    """``device`` as a :class:`torch.device` (an int is a CUDA index); ``None`` stays ``None``.

    Raises:
        TypeError: for another type (a bool included).
        ValueError: for a negative index or a string that names no device.

    Example:
        >>> as_device(1), as_device("cpu")
        (device(type='cuda', index=1), device(type='cpu'))
    """
    if device is None or isinstance(device, torch.device):
        return device
    if isinstance(device, bool):
        raise TypeError(f"device must be a torch.device, a string or a CUDA index, got {device!r}")
    if isinstance(device, int):
        if device < 0:
            raise ValueError(f"CUDA device index must be >= 0, got {device}")
        return torch.device("cuda", device)
    if isinstance(device, str):
        try:
            return torch.device(device)
        except RuntimeError as err:
            raise ValueError(f"not a device: {device!r} ({err})") from None
    raise TypeError(f"device must be a torch.device, a string or a CUDA index, got {device!r}")


def cuda_index(device: torch.device | str | int | None, probe: str) -> int:
    """The CUDA ordinal of ``device`` (the current device when it names none).

    Args:
        device: see :func:`as_device`.
        probe: the probe's name, for messages.

    Raises:
        ValueError: if ``device`` is not a CUDA device.
        ProbeUnavailable: if the current CUDA device cannot be told.

    Example:
        >>> cuda_index("cuda:2", "NVMLProbe")
        2
    """
    dev = as_device(device)
    if dev is not None and dev.type != "cuda":
        raise ValueError(f"{probe} measures CUDA devices, got {dev}")
    if dev is not None and dev.index is not None:
        return dev.index
    if not torch.cuda.is_available():
        return 0  # nothing to ask; an injected UUID lookup (tests) gets device 0
    try:
        return torch.cuda.current_device()
    except Exception as err:
        raise ProbeUnavailable(
            f"{probe}: cannot tell the current CUDA device ({describe_error(err)})"
        ) from err


def cuda_device_uuid(index: int) -> str:
    """The UUID CUDA reports for ``cuda:<index>`` (as torch prints it, often without ``GPU-``).

    Raises:
        ProbeUnavailable: if CUDA is not available or the properties cannot be read.
    """
    if not torch.cuda.is_available():
        raise ProbeUnavailable(f"CUDA is not available, so the UUID of cuda:{index} cannot be read")
    try:
        uuid = torch.cuda.get_device_properties(index).uuid
    except Exception as err:
        raise ProbeUnavailable(f"cannot read the UUID of cuda:{index} ({describe_error(err)})") from err
    return str(uuid)
