"""The torch details ``lightning_bandlimit/memory/_torch.py`` relies on still have their shape.

If one of these fails, the installed torch changed something the memory probes read; fix
``memory/_torch.py`` (the only place that reads it), not the probes.
"""

from __future__ import annotations

import types

import pytest
import torch

from lightning_bandlimit.memory import ProbeUnavailable
from lightning_bandlimit.memory._torch import as_device, cuda_device_uuid, cuda_index


def test_cuda_device_properties_have_a_uuid() -> None:
    properties = getattr(torch._C, "_CudaDeviceProperties", None)
    assert properties is not None, (
        f"torch {torch.__version__} has no torch._C._CudaDeviceProperties, the type "
        "torch.cuda.get_device_properties returns; memory/_torch.py:cuda_device_uuid reads its uuid"
    )
    assert "uuid" in dir(properties), (
        f"torch {torch.__version__}: torch._C._CudaDeviceProperties has no 'uuid' field any more; "
        "memory/_torch.py:cuda_device_uuid (NVMLProbe's default UUID lookup) reads it"
    )


def test_cuda_device_uuid_reads_the_properties(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: types.SimpleNamespace(uuid="ab-1"))
    assert cuda_device_uuid(0) == "ab-1"
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: object())
    with pytest.raises(ProbeUnavailable, match="cannot read the UUID of cuda:3 .*AttributeError"):
        cuda_device_uuid(3)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ProbeUnavailable, match="CUDA is not available"):
        cuda_device_uuid(0)


def test_devices_and_indices() -> None:
    assert as_device(None) is None and as_device(2) == torch.device("cuda", 2)
    assert cuda_index(torch.device("cuda", 1), "NVMLProbe") == 1
    with pytest.raises(ValueError, match="NVMLProbe measures CUDA devices, got cpu"):
        cuda_index("cpu", "NVMLProbe")
    with pytest.raises(TypeError, match="got True"):
        as_device(True)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="must be >= 0"):
        as_device(-1)
