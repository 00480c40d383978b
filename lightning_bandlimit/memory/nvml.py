"""The NVML probe: a CUDA device's free memory as NVIDIA's management library reports it.

NVML (``pynvml`` from ``nvidia-ml-py``) sees the whole device as the driver does, every
process's memory included, MIG instances too. The CUDA device is matched to its NVML handle by
UUID, because NVML ignores ``CUDA_VISIBLE_DEVICES`` and orders devices by PCI bus.
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Callable
from types import ModuleType
from typing import Any

import torch

from lightning_bandlimit.memory._torch import cuda_device_uuid, cuda_index
from lightning_bandlimit.memory.protocol import MemoryProbe, MemoryReading, ProbeUnavailable, describe_error

__all__ = ["NVMLProbe"]

# NVML users in this process, per NVML module (the real pynvml, or a test double): module id ->
# [module, number of open NVMLProbes]. nvmlInit on the first, nvmlShutdown after the last.
# (NVML counts nvmlInit/nvmlShutdown pairs itself, so other users of NVML in the process, such
# as torch.cuda.utilization, are not disturbed by our shutdown.)
_NVML_LOCK = threading.Lock()
_NVML_USERS: dict[int, list[Any]] = {}

_NVML_HINTS = {
    "NVMLError_LibraryNotFound": "libnvidia-ml.so.1 cannot be loaded (no NVIDIA driver visible to this "
    "process, e.g. a container started without the driver libraries)",
    "NVMLError_DriverNotLoaded": "the NVIDIA kernel driver is not loaded",
    "NVMLError_NotSupported": "this device does not report its memory through NVML (e.g. unified-memory "
    "GPUs)",
    "NVMLError_NoPermission": "this process is not allowed to query the device through NVML",
    "NVMLError_NotFound": "NVML does not know this device",
}


def _nvml_error_text(nvml: Any, err: BaseException) -> str:
    text = describe_error(err)
    for name, hint in _NVML_HINTS.items():
        cls = getattr(nvml, name, None)
        if isinstance(cls, type) and isinstance(err, cls):
            return f"{text} -- {hint}"
    return text


def _nvml_is(nvml: Any, err: BaseException, *names: str) -> bool:
    classes = tuple(c for c in (getattr(nvml, n, None) for n in names) if isinstance(c, type))
    return bool(classes) and isinstance(err, classes)


def _nvml_acquire(nvml: Any) -> None:
    with _NVML_LOCK:
        entry = _NVML_USERS.get(id(nvml))
        if entry is None:
            nvml.nvmlInit()  # may raise: nothing recorded then
            _NVML_USERS[id(nvml)] = [nvml, 1]
        else:
            entry[1] += 1


def _nvml_release(nvml: Any) -> None:
    with _NVML_LOCK:
        entry = _NVML_USERS.get(id(nvml))
        if entry is None:
            return
        entry[1] -= 1
        if entry[1] > 0:
            return
        del _NVML_USERS[id(nvml)]
        try:
            nvml.nvmlShutdown()
        except Exception:  # noqa: BLE001,S110 -- shutting down must never fail training
            pass


def _uuid_candidates(raw: str) -> list[str]:
    uuid = raw.strip()
    if uuid[:4].upper() in ("GPU-", "MIG-"):
        return [uuid[:4].upper() + uuid[4:]]
    return [f"GPU-{uuid}", f"MIG-{uuid}"]


class NVMLProbe(MemoryProbe):
    """Free memory of a CUDA device as NVML reports it for the whole device (all processes).

    The CUDA device is mapped to its NVML handle by UUID, never by index: NVML ignores
    ``CUDA_VISIBLE_DEVICES`` and numbers devices by PCI bus. UUIDs without a ``GPU-``/``MIG-``
    prefix (as torch prints them) are tried as ``GPU-<uuid>`` and then ``MIG-<uuid>``; on a MIG
    instance the reading is that instance's memory. ``nvmlInit`` runs once per process for all
    NVML probes, ``nvmlShutdown`` when the last one closes. Construction reads the memory once,
    so a device NVML cannot measure fails here rather than on the first ``read()``.

    Reading the UUID (without ``uuid_of``) initialises CUDA in this process.

    Args:
        device: the CUDA device (``torch.device``, ``"cuda:1"`` or an index); ``None`` or a
            device without index means the current CUDA device.
        nvml: the NVML module to use; by default ``pynvml`` (from ``nvidia-ml-py``), imported
            lazily. For tests.
        uuid_of: maps a CUDA index to its UUID; by default
            ``str(torch.cuda.get_device_properties(index).uuid)``. For tests.

    Raises:
        ProbeUnavailable: if ``pynvml`` cannot be imported, NVML cannot start, the device's UUID
            cannot be read or matched (MIG instances included), or its memory cannot be read;
            the message names the NVML error.
        ValueError: if ``device`` is not a CUDA device.

    Example:
        >>> probe = NVMLProbe("cuda:0")  # doctest: +SKIP
        >>> probe.read()  # doctest: +SKIP
        MemoryReading(total=85520809984, free=60129542144, source='nvml', own=None, own_base=None)
        >>> probe.close()  # doctest: +SKIP
    """

    source = "nvml"

    def __init__(
        self,
        device: torch.device | str | int | None = None,
        *,
        nvml: ModuleType | None = None,
        uuid_of: Callable[[int], str] | None = None,
    ) -> None:
        self._closed = True  # until fully constructed: close() must not release anything
        self.index: int = cuda_index(device, "NVMLProbe")
        self.device = torch.device("cuda", self.index)
        try:
            raw = (uuid_of or cuda_device_uuid)(self.index)
        except ProbeUnavailable:
            raise
        except Exception as err:
            raise ProbeUnavailable(f"cannot read the UUID of {self.device} ({describe_error(err)})") from err
        if not isinstance(raw, str) or not raw.strip():
            raise ProbeUnavailable(f"no UUID for {self.device} (got {raw!r})")
        if nvml is None:
            try:
                nvml = importlib.import_module("pynvml")
            except ImportError as err:
                raise ProbeUnavailable(
                    f"cannot import pynvml ({describe_error(err)}); install nvidia-ml-py"
                ) from err
        self._nvml: Any = nvml
        try:
            _nvml_acquire(nvml)
        except Exception as err:
            raise ProbeUnavailable(f"NVML cannot start ({_nvml_error_text(nvml, err)})") from err
        try:
            self._handle, self.uuid = self._lookup(raw)
            self._closed = False
            self.read()
        except BaseException:
            self._closed = True
            _nvml_release(nvml)
            raise

    def _lookup(self, raw: str) -> tuple[Any, str]:
        nvml = self._nvml
        tried: list[str] = []
        for uuid in _uuid_candidates(raw):
            try:
                # bytes: pynvml passes the argument to ctypes.c_char_p, which refuses str
                return nvml.nvmlDeviceGetHandleByUUID(uuid.encode()), uuid
            except Exception as err:
                if not _nvml_is(nvml, err, "NVMLError_NotFound", "NVMLError_InvalidArgument"):
                    raise ProbeUnavailable(
                        f"NVML cannot open {self.device} ({uuid}): {_nvml_error_text(nvml, err)}"
                    ) from err
                tried.append(f"{uuid} ({describe_error(err)})")
        if raw.strip().upper().startswith("MIG-"):
            raise ProbeUnavailable(
                f"CUDA exposes MIG instance {raw.strip()} as {self.device}, but NVML finds no handle for "
                f"it: {'; '.join(tried)}. Its memory cannot be read through NVML here."
            )
        raise ProbeUnavailable(
            f"NVML has no device with the UUID of {self.device}, neither as a GPU nor as a MIG "
            f"instance: tried {'; '.join(tried)}"
        )

    def read(self) -> MemoryReading:
        """Device-wide memory now (every process's use counted).

        Returns:
            A :class:`MemoryReading` with ``source="nvml"``.

        Raises:
            ProbeUnavailable: if NVML fails (the message names the error) or the probe is closed.
        """
        self._ensure_open()
        try:
            info = self._nvml.nvmlDeviceGetMemoryInfo(self._handle)
            total, free = int(info.total), int(info.free)
        except Exception as err:
            raise ProbeUnavailable(
                f"NVML cannot read the memory of {self.device} ({self.uuid}): "
                f"{_nvml_error_text(self._nvml, err)}"
            ) from err
        total = max(total, 0)
        return MemoryReading(total=total, free=min(max(free, 0), total), source=self.source)

    def process_memory(self) -> dict[int, int]:
        """NVML's per-process memory on the device (``nvmlDeviceGetComputeRunningProcesses``):
        each compute process's CUDA context, allocator cache and tensors, by process id. Process
        ids are the host's: in a container they are not the ones ``os.getpid()`` gives. A process
        whose memory NVML does not report is left out.

        Raises:
            ProbeUnavailable: if NVML fails (the message names the error) or the probe is closed.
        """
        self._ensure_open()
        try:
            processes = self._nvml.nvmlDeviceGetComputeRunningProcesses(self._handle)
        except Exception as err:
            raise ProbeUnavailable(
                f"NVML cannot list the processes of {self.device} ({self.uuid}): "
                f"{_nvml_error_text(self._nvml, err)}"
            ) from err
        found: dict[int, int] = {}
        for process in processes:
            used = getattr(process, "usedGpuMemory", None)
            if isinstance(used, int) and used >= 0:
                found[int(process.pid)] = found.get(int(process.pid), 0) + used
        return found

    def close(self) -> None:
        """Drop the handle; ``nvmlShutdown`` if this was the last open NVML probe. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._handle = None
        _nvml_release(self._nvml)

    def __repr__(self) -> str:
        return f"NVMLProbe({self.device}, uuid={getattr(self, 'uuid', None)!r}, closed={self._closed})"
