"""Memory probes: how much memory the device a job runs on has free *right now*.

A probe answers one question, ``read() -> MemoryReading(total, free, source)``, for one device,
counting memory taken by **other processes** too (co-tenants on a shared GPU, other jobs in the
same host or container). A memory-aware callback polls a probe to raise or lower its compression.

Probes, best first:

* :class:`NVMLProbe` -- NVIDIA's management library (``pynvml`` from ``nvidia-ml-py``). Whole
  device memory as the driver sees it; the CUDA device is matched to its NVML handle by UUID
  (NVML ignores ``CUDA_VISIBLE_DEVICES`` and orders devices by PCI bus), MIG instances included.
* :class:`CudaProbe` -- ``torch.cuda.mem_get_info`` (also device-wide), the fallback when NVML
  cannot be used (no ``libnvidia-ml`` in the container, unified-memory GPUs, ...).
* :class:`HostMemoryProbe` -- CPU jobs: ``/proc/meminfo`` bounded by the process's cgroup limit.
* :class:`ScriptedProbe` -- a replayed or synthetic trace, for tests and simulations.

:func:`auto_probe` picks the best that works for a device. Probes never crash training: every
failure to measure is a :class:`ProbeUnavailable`, from construction or from ``read()``.

Example:
    >>> with ScriptedProbe([6_000, 2_500], total=8_000) as probe:
    ...     first, second = probe.read(), probe.read()
    >>> first.free, second.used, second.free_fraction
    (6000, 5500, 0.3125)
"""

from __future__ import annotations

import abc
import csv
import importlib
import math
import operator
import threading
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from types import ModuleType, TracebackType
from typing import Any

import torch
from typing_extensions import Self

__all__ = [
    "CudaProbe",
    "HostMemoryProbe",
    "MemoryProbe",
    "MemoryReading",
    "NVMLProbe",
    "ProbeUnavailable",
    "ScriptedProbe",
    "auto_probe",
]


# --------------------------------------------------------------------------------------------
# Reading, errors, base class
# --------------------------------------------------------------------------------------------


def _as_bytes(name: str, value: Any) -> int:
    if isinstance(value, bool):
        raise TypeError(f"{name} must be an integer number of bytes, got {value!r}")
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an integer number of bytes, got {value!r}") from None


@dataclass(frozen=True)
class MemoryReading:
    """One measurement of a device's memory, in bytes.

    Attributes:
        total: bytes the job could use at most (device total; on the host the smaller of
            ``MemTotal`` and the cgroup limit).
        free: bytes free for this job now, after what *every* process on the device uses
            (on the host the smaller of ``MemAvailable`` and the cgroup's headroom).
        source: which probe measured it: ``"nvml"``, ``"cuda"``, ``"host"``, ``"budget"`` or
            ``"scripted"``.
        own: bytes of ``total - free`` that this job itself uses, when the probe can tell them
            apart from other processes' (:class:`~lightning_bandlimit.memory.SharedBudgetProbe`
            does); ``None`` otherwise.

    Raises:
        TypeError: if ``total``, ``free`` or ``own`` is not an integer.
        ValueError: unless ``0 <= free <= total`` and ``own >= 0``.

    Example:
        >>> reading = MemoryReading(total=1000, free=250, source="scripted")
        >>> reading.used, reading.free_fraction
        (750, 0.25)
        >>> MemoryReading(total=1000, free=1001, source="scripted")
        Traceback (most recent call last):
            ...
        ValueError: MemoryReading needs 0 <= free <= total, got free=1001, total=1000
    """

    total: int
    free: int
    source: str
    own: int | None = None

    def __post_init__(self) -> None:
        total = _as_bytes("MemoryReading.total", self.total)
        free = _as_bytes("MemoryReading.free", self.free)
        if total < 0 or not 0 <= free <= total:
            raise ValueError(f"MemoryReading needs 0 <= free <= total, got free={free}, total={total}")
        object.__setattr__(self, "total", total)
        object.__setattr__(self, "free", free)
        if self.own is not None:
            own = _as_bytes("MemoryReading.own", self.own)
            if own < 0:
                raise ValueError(f"MemoryReading.own must be at least 0, got {own}")
            object.__setattr__(self, "own", own)

    @property
    def used(self) -> int:
        """Bytes in use by anyone (``total - free``)."""
        return self.total - self.free

    @property
    def free_fraction(self) -> float:
        """``free / total`` in ``[0, 1]`` (``0.0`` for an empty device)."""
        return self.free / self.total if self.total else 0.0


class ProbeUnavailable(RuntimeError):
    """A probe cannot measure memory (here, or any more); the message says why.

    Example:
        >>> issubclass(ProbeUnavailable, RuntimeError)
        True
    """


class MemoryProbe(abc.ABC):
    """Reads the free memory of one device. A context manager: leaving it calls :meth:`close`.

    Subclasses set the class attribute ``source`` and implement :meth:`read`, which raises
    :class:`ProbeUnavailable` (never anything else) when memory cannot be measured. A probe
    whose readings carry the job's own memory (:attr:`MemoryReading.own`) sets
    ``measures_own = True``, so a caller need not measure the job itself.

    Example:
        >>> with ScriptedProbe([10], total=10) as probe:
        ...     probe.read().free
        10
        >>> probe.closed
        True
    """

    source: str = ""
    measures_own: bool = False
    _closed: bool = False

    @abc.abstractmethod
    def read(self) -> MemoryReading:
        """Measure now.

        Returns:
            The current :class:`MemoryReading`.

        Raises:
            ProbeUnavailable: if memory cannot be measured (or the probe is closed).
        """

    def close(self) -> None:
        """Release what the probe holds. Idempotent; later reads raise :class:`ProbeUnavailable`."""
        self._closed = True

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._closed

    def _ensure_open(self) -> None:
        if self._closed:
            raise ProbeUnavailable(f"{type(self).__name__} is closed")

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


# --------------------------------------------------------------------------------------------
# Devices
# --------------------------------------------------------------------------------------------


def _to_device(device: torch.device | str | int | None) -> torch.device | None:
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


def _cuda_index(device: torch.device | str | int | None, probe: str) -> int:
    """The CUDA ordinal of ``device`` (the current device when it names none)."""
    dev = _to_device(device)
    if dev is not None and dev.type != "cuda":
        raise ValueError(f"{probe} measures CUDA devices, got {dev}")
    if dev is not None and dev.index is not None:
        return dev.index
    if not torch.cuda.is_available():
        return 0  # nothing to ask; an injected UUID lookup (tests) gets device 0
    try:
        return torch.cuda.current_device()
    except Exception as err:
        raise ProbeUnavailable(f"{probe}: cannot tell the current CUDA device ({_describe(err)})") from err


def _describe(err: BaseException) -> str:
    try:
        text = str(err)
    except Exception:  # noqa: BLE001 -- pynvml's __str__ may call into a broken library
        text = ""
    name = type(err).__name__
    return f"{name}: {text}" if text else name


# --------------------------------------------------------------------------------------------
# NVML
# --------------------------------------------------------------------------------------------

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
    text = _describe(err)
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


def _torch_device_uuid(index: int) -> str:
    """The UUID CUDA reports for ``cuda:<index>`` (as torch prints it, often without ``GPU-``)."""
    if not torch.cuda.is_available():
        raise ProbeUnavailable(f"CUDA is not available, so the UUID of cuda:{index} cannot be read")
    try:
        uuid = torch.cuda.get_device_properties(index).uuid
    except Exception as err:
        raise ProbeUnavailable(f"cannot read the UUID of cuda:{index} ({_describe(err)})") from err
    return str(uuid)


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
        MemoryReading(total=85520809984, free=60129542144, source='nvml', own=None)
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
        self.index: int = _cuda_index(device, "NVMLProbe")
        self.device = torch.device("cuda", self.index)
        try:
            raw = (uuid_of or _torch_device_uuid)(self.index)
        except ProbeUnavailable:
            raise
        except Exception as err:
            raise ProbeUnavailable(f"cannot read the UUID of {self.device} ({_describe(err)})") from err
        if not isinstance(raw, str) or not raw.strip():
            raise ProbeUnavailable(f"no UUID for {self.device} (got {raw!r})")
        if nvml is None:
            try:
                nvml = importlib.import_module("pynvml")
            except ImportError as err:
                raise ProbeUnavailable(
                    f"cannot import pynvml ({_describe(err)}); install nvidia-ml-py"
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
                tried.append(f"{uuid} ({_describe(err)})")
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

    def close(self) -> None:
        """Drop the handle; ``nvmlShutdown`` if this was the last open NVML probe. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._handle = None
        _nvml_release(self._nvml)

    def __repr__(self) -> str:
        return f"NVMLProbe({self.device}, uuid={getattr(self, 'uuid', None)!r}, closed={self._closed})"


# --------------------------------------------------------------------------------------------
# torch.cuda
# --------------------------------------------------------------------------------------------


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
        dev = _to_device(device)
        if dev is not None and dev.type != "cuda":
            raise ValueError(f"CudaProbe measures CUDA devices, got {dev}")
        if not torch.cuda.is_available():
            raise ProbeUnavailable("CUDA is not available (torch.cuda.is_available() is False)")
        self.index: int = _cuda_index(dev, "CudaProbe")
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
                f"torch.cuda.mem_get_info({self.device}) failed: {_describe(err)}"
            ) from err
        total = max(total, 0)
        return MemoryReading(total=total, free=min(max(free, 0), total), source=self.source)

    def __repr__(self) -> str:
        return f"CudaProbe({self.device}, closed={self._closed})"


# --------------------------------------------------------------------------------------------
# Host
# --------------------------------------------------------------------------------------------

# cgroup v1 writes "no limit" as a huge number (PAGE_COUNTER_MAX pages, ~2**63).
_V1_UNLIMITED = 1 << 60


def _read_text(path: Path) -> str | None:
    try:
        return path.read_text()
    except (OSError, UnicodeDecodeError):
        return None


def _read_int(path: Path) -> int | None:
    text = _read_text(path)
    if text is None:
        return None
    try:
        return int(text.strip())
    except ValueError:
        return None


def _parse_meminfo(text: str) -> dict[str, int]:
    values: dict[str, int] = {}
    for line in text.splitlines():
        key, sep, rest = line.partition(":")
        fields = rest.split()
        if not sep or not fields:
            continue
        try:
            number = int(fields[0])
        except ValueError:
            continue
        unit = fields[1].lower() if len(fields) > 1 else ""
        values[key.strip()] = number * 1024 if unit == "kb" else number
    return values


class HostMemoryProbe(MemoryProbe):
    """Free host memory for this process: ``/proc/meminfo`` bounded by its cgroup's limit.

    ``total`` is ``MemTotal`` and ``free`` is ``MemAvailable`` (``MemFree`` on kernels without
    it). When the process's cgroup -- or one of its ancestors -- has a memory limit, ``total`` is
    at most that limit and ``free`` at most the limit minus the cgroup's usage. cgroup v2 reads
    ``memory.max``/``memory.current`` under ``<cgroup_root>/<path>`` (path from the ``0::/path``
    line of ``self_cgroup``); cgroup v1 (a ``memory`` controller line) reads
    ``memory.limit_in_bytes``/``memory.usage_in_bytes`` under ``<cgroup_root>/memory/<path>``.
    Without a cgroup, or when its files cannot be read, only ``meminfo`` counts (no error).
    The cgroup's usage includes its page cache, so ``free`` is on the cautious side.

    Args:
        meminfo: the ``meminfo`` file.
        cgroup_root: where the cgroup file system is mounted.
        self_cgroup: the file listing this process's cgroups.

    Raises:
        ProbeUnavailable: if ``meminfo`` cannot be read or has no ``MemTotal`` (checked at
            construction, and again by every ``read()``).

    Example:
        >>> import tempfile
        >>> from pathlib import Path
        >>> with tempfile.TemporaryDirectory() as tmp:
        ...     root = Path(tmp)
        ...     _ = (root / "meminfo").write_text("MemTotal: 8000 kB\\nMemAvailable: 6000 kB\\n")
        ...     _ = (root / "self").write_text("0::/job\\n")
        ...     (root / "job").mkdir()
        ...     _ = (root / "job" / "memory.max").write_text(str(4000 * 1024))
        ...     _ = (root / "job" / "memory.current").write_text(str(1000 * 1024))
        ...     probe = HostMemoryProbe(meminfo=root / "meminfo", cgroup_root=root, self_cgroup=root / "self")
        ...     reading = probe.read()
        >>> reading.total // 1024, reading.free // 1024, reading.source
        (4000, 3000, 'host')
    """

    source = "host"

    def __init__(
        self,
        *,
        meminfo: str | Path = "/proc/meminfo",
        cgroup_root: str | Path = "/sys/fs/cgroup",
        self_cgroup: str | Path = "/proc/self/cgroup",
    ) -> None:
        self.meminfo = Path(meminfo)
        self.cgroup_root = Path(cgroup_root)
        self.self_cgroup = Path(self_cgroup)
        self.read()

    def _meminfo(self) -> tuple[int, int]:
        try:
            text = self.meminfo.read_text()
        except (OSError, UnicodeDecodeError) as err:
            raise ProbeUnavailable(f"cannot read {self.meminfo} ({_describe(err)})") from err
        values = _parse_meminfo(text)
        if "MemTotal" not in values:
            raise ProbeUnavailable(f"{self.meminfo} has no MemTotal line")
        total = values["MemTotal"]
        available = values.get("MemAvailable", values.get("MemFree", 0))
        return total, available

    def _cgroup_dirs(self) -> list[tuple[str, Path]]:
        """(version, directory) of this process's memory cgroup and its ancestors, leaf first."""
        text = _read_text(self.self_cgroup)
        if text is None:
            return []
        found: list[tuple[str, Path]] = []
        for line in text.splitlines():
            parts = line.strip().split(":", 2)
            if len(parts) != 3:
                continue
            hierarchy, controllers, path = parts
            if hierarchy == "0" and controllers == "":
                version, base = "v2", self.cgroup_root
            elif "memory" in controllers.split(","):
                version, base = "v1", self.cgroup_root / "memory"
            else:
                continue
            rel = [p for p in PurePosixPath(path).parts if p != "/"]
            if ".." in rel:  # cgroup outside this namespace's view: only the visible root
                rel = []
            found.extend((version, base.joinpath(*rel[:k])) for k in range(len(rel), -1, -1))
        return found

    def _cgroup_bounds(self) -> tuple[int | None, int | None]:
        """(smallest limit, smallest headroom) over the limited cgroup levels; None if unlimited."""
        limit: int | None = None
        headroom: int | None = None
        for version, directory in self._cgroup_dirs():
            if version == "v2":
                raw_max = _read_text(directory / "memory.max")
                if raw_max is None or raw_max.strip() == "max":
                    continue
                level_limit = _read_int(directory / "memory.max")
                usage = _read_int(directory / "memory.current")
            else:
                level_limit = _read_int(directory / "memory.limit_in_bytes")
                if level_limit is not None and level_limit >= _V1_UNLIMITED:
                    continue
                usage = _read_int(directory / "memory.usage_in_bytes")
            if level_limit is None or level_limit < 0:
                continue
            limit = level_limit if limit is None else min(limit, level_limit)
            if usage is not None:
                room = max(level_limit - usage, 0)
                headroom = room if headroom is None else min(headroom, room)
        return limit, headroom

    def read(self) -> MemoryReading:
        """Host memory now, bounded by the cgroup limit.

        Returns:
            A :class:`MemoryReading` with ``source="host"``.

        Raises:
            ProbeUnavailable: if ``meminfo`` cannot be read or the probe is closed.
        """
        self._ensure_open()
        total, free = self._meminfo()
        limit, headroom = self._cgroup_bounds()
        if limit is not None:
            total = min(total, limit)
        if headroom is not None:
            free = min(free, headroom)
        total = max(total, 0)
        return MemoryReading(total=total, free=min(max(free, 0), total), source=self.source)

    def __repr__(self) -> str:
        return f"HostMemoryProbe(meminfo={str(self.meminfo)!r}, closed={self._closed})"


# --------------------------------------------------------------------------------------------
# Scripted
# --------------------------------------------------------------------------------------------


def _check_free(value: Any, total: int, where: str) -> int:
    try:
        free = _as_bytes(where, value)
    except TypeError as err:
        raise ValueError(str(err)) from None
    if free < 0:
        raise ValueError(f"{where} must be >= 0 bytes, got {free}")
    if free > total:
        raise ValueError(f"{where} is {free} bytes, more than total={total}")
    return free


def _parse_csv_int(text: str | None, where: str) -> int:
    cell = (text or "").strip()
    if not cell:
        raise ValueError(f"{where} is empty")
    try:
        return int(cell)
    except ValueError:
        pass
    try:
        number = float(cell)
    except ValueError:
        raise ValueError(f"{where} is not a number: {cell!r}") from None
    if not math.isfinite(number):
        raise ValueError(f"{where} is not finite: {cell!r}")
    return round(number)


class ScriptedProbe(MemoryProbe):
    """Replays a memory trace: the ``i``-th ``read()`` gets ``free[i]`` (the last value once the
    trace is over) or ``free(i)`` for a callable.

    Args:
        free: free bytes per read, or a function of the read's index (from 0) giving them.
        total: the device's total bytes, ``> 0``.

    Attributes:
        reads: how many readings were returned so far.

    Raises:
        ValueError: if ``total`` is not a positive integer, the trace is empty, or a value is
            negative, not an integer, or above ``total`` (for a callable: when it is read).
        TypeError: if ``free`` is a string.

    Example:
        >>> probe = ScriptedProbe([800, 500, 300], total=1000)
        >>> [probe.read().free for _ in range(4)]
        [800, 500, 300, 300]
        >>> probe.reads
        4
        >>> ScriptedProbe(lambda i: 1000 - 100 * i, total=1000).read().free_fraction
        1.0
    """

    source = "scripted"

    def __init__(self, free: Sequence[int] | Callable[[int], int], total: int) -> None:
        try:
            total = _as_bytes("ScriptedProbe total", total)
        except TypeError as err:
            raise ValueError(str(err)) from None
        if total <= 0:
            raise ValueError(f"ScriptedProbe total must be > 0 bytes, got {total}")
        self.total = total
        self.reads = 0
        self._fn: Callable[[int], int] | None = None
        self._trace: list[int] = []
        if callable(free):
            self._fn = free
        else:
            if isinstance(free, (str, bytes)):
                raise TypeError("ScriptedProbe free must be a sequence of ints or a callable, got a string")
            values = list(free)
            if not values:
                raise ValueError("ScriptedProbe needs a non-empty trace of free bytes")
            self._trace = [_check_free(v, total, f"free[{i}]") for i, v in enumerate(values)]

    @classmethod
    def from_csv(cls, path: str | Path, total: int | None = None) -> ScriptedProbe:
        """Replay a recorded trace: a CSV file whose header has a ``free`` column (bytes).

        Args:
            path: the CSV file. Other columns are ignored, except ``total``.
            total: the device's total bytes; by default the largest value of the file's
                ``total`` column.

        Returns:
            A :class:`ScriptedProbe` over the ``free`` column, in file order.

        Raises:
            ValueError: if the file has no ``free`` column, no rows, a bad value, or no total
                (neither a ``total`` argument nor column).
            OSError: if the file cannot be read.

        Example:
            >>> import tempfile, os
            >>> with tempfile.TemporaryDirectory() as tmp:
            ...     path = os.path.join(tmp, "trace.csv")
            ...     with open(path, "w") as f:
            ...         _ = f.write("step,free,total\\n0,900,1000\\n1,400,1000\\n")
            ...     probe = ScriptedProbe.from_csv(path)
            >>> [probe.read().free for _ in range(3)], probe.total
            ([900, 400, 400], 1000)
        """
        with open(path, newline="") as handle:
            reader = csv.reader(handle)
            header = next(reader, None)
            if header is None:
                raise ValueError(f"{path}: empty file, expected a header row with a 'free' column")
            names = [name.strip().lower() for name in header]
            if "free" not in names:
                raise ValueError(f"{path}: no 'free' column in header {header}")
            free_col = names.index("free")
            total_col = names.index("total") if "total" in names else None
            frees: list[int] = []
            totals: list[int] = []
            for line, row in enumerate(reader, start=2):
                if not any(cell.strip() for cell in row):
                    continue
                cells = row + [""] * (len(names) - len(row))
                frees.append(_parse_csv_int(cells[free_col], f"{path}:{line} free"))
                if total_col is not None:
                    totals.append(_parse_csv_int(cells[total_col], f"{path}:{line} total"))
        if not frees:
            raise ValueError(f"{path}: no rows after the header, the trace is empty")
        if total is None:
            if not totals:
                raise ValueError(f"{path}: no 'total' column; pass total= to from_csv")
            total = max(totals)
        return cls(frees, total=total)

    def read(self) -> MemoryReading:
        """The next value of the trace.

        Returns:
            A :class:`MemoryReading` with ``source="scripted"``.

        Raises:
            ProbeUnavailable: if the probe is closed.
            ValueError: if a callable trace gives a bad value.
        """
        self._ensure_open()
        index = self.reads
        if self._fn is not None:
            free = _check_free(self._fn(index), self.total, f"free({index})")
        else:
            free = self._trace[min(index, len(self._trace) - 1)]
        self.reads += 1
        return MemoryReading(total=self.total, free=free, source=self.source)

    def __repr__(self) -> str:
        kind = "callable" if self._fn is not None else f"{len(self._trace)} values"
        return f"ScriptedProbe({kind}, total={self.total}, reads={self.reads})"


# --------------------------------------------------------------------------------------------
# Choosing
# --------------------------------------------------------------------------------------------


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
    dev = _to_device(device)
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
