"""Memory probes: NVML (against a fake pynvml), torch.cuda, host (/proc/meminfo + cgroups),
scripted traces, and auto_probe's fallback chain."""

from __future__ import annotations

import sys
import types
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch

from lightning_bandlimit import memory
from lightning_bandlimit.memory import (
    CudaProbe,
    HostMemoryProbe,
    MemoryProbe,
    MemoryReading,
    NVMLProbe,
    ProbeUnavailable,
    ScriptedProbe,
    auto_probe,
)
from lightning_bandlimit.memory import probes as probes_module

GiB = 1 << 30
KiB = 1024


# --------------------------------------------------------------------------------------------
# A fake pynvml
# --------------------------------------------------------------------------------------------


class NVMLError(Exception):
    pass


class NVMLError_LibraryNotFound(NVMLError):
    pass


class NVMLError_DriverNotLoaded(NVMLError):
    pass


class NVMLError_NotSupported(NVMLError):
    pass


class NVMLError_NoPermission(NVMLError):
    pass


class NVMLError_NotFound(NVMLError):
    pass


ERRORS = [
    NVMLError_LibraryNotFound,
    NVMLError_DriverNotLoaded,
    NVMLError_NotSupported,
    NVMLError_NoPermission,
    NVMLError_NotFound,
    NVMLError,
]


class FakeHandle:
    def __init__(self, uuid: str, total: int, free: int) -> None:
        self.uuid, self.total, self.free = uuid, total, free
        self.processes: list[Any] = []  # pynvml's c_nvmlProcessInfo_t: pid, usedGpuMemory


class FakeNVML:
    """Enough of pynvml: NVML order is the list order (PCI bus), lookups by UUID bytes."""

    NVMLError = NVMLError
    NVMLError_LibraryNotFound = NVMLError_LibraryNotFound
    NVMLError_DriverNotLoaded = NVMLError_DriverNotLoaded
    NVMLError_NotSupported = NVMLError_NotSupported
    NVMLError_NoPermission = NVMLError_NoPermission
    NVMLError_NotFound = NVMLError_NotFound

    def __init__(self, devices: list[tuple[str, int, int]]) -> None:
        self.handles = [FakeHandle(*d) for d in devices]
        self.init_calls = 0
        self.shutdown_calls = 0
        self.lookups: list[str] = []
        self.fail: dict[str, Exception] = {}
        self.listings = 0

    def _maybe_fail(self, name: str) -> None:
        if name in self.fail:
            raise self.fail[name]

    def nvmlInit(self) -> None:
        self._maybe_fail("nvmlInit")
        self.init_calls += 1

    def nvmlShutdown(self) -> None:
        self.shutdown_calls += 1

    def nvmlDeviceGetHandleByUUID(self, uuid: bytes) -> FakeHandle:
        assert isinstance(uuid, bytes), "real pynvml hands the UUID to ctypes.c_char_p: bytes only"
        assert self.init_calls > self.shutdown_calls, "NVML used while not initialised"
        self._maybe_fail("nvmlDeviceGetHandleByUUID")
        text = uuid.decode()
        self.lookups.append(text)
        for handle in self.handles:
            if handle.uuid == text:
                return handle
        raise NVMLError_NotFound("Not Found")

    def nvmlDeviceGetMemoryInfo(self, handle: FakeHandle) -> types.SimpleNamespace:
        assert self.init_calls > self.shutdown_calls, "NVML used while not initialised"
        self._maybe_fail("nvmlDeviceGetMemoryInfo")
        return types.SimpleNamespace(total=handle.total, free=handle.free, used=handle.total - handle.free)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeHandle:
        raise AssertionError("NVML indices ignore CUDA_VISIBLE_DEVICES: map by UUID")

    def nvmlDeviceGetComputeRunningProcesses(self, handle: FakeHandle) -> list[Any]:
        assert self.init_calls > self.shutdown_calls, "NVML used while not initialised"
        self._maybe_fail("nvmlDeviceGetComputeRunningProcesses")
        self.listings += 1
        return list(handle.processes)

    def handle(self, uuid: str) -> FakeHandle:
        return next(h for h in self.handles if h.uuid == uuid)


# NVML order: the "bbbb" GPU sits first on the PCI bus, but CUDA (CUDA_VISIBLE_DEVICES=1,0 or
# FASTEST_FIRST) calls "aaaa" cuda:0.
TORCH_UUIDS = {0: "aaaa", 1: "bbbb", 2: "MIG-cccc", 3: "dddd"}


@pytest.fixture
def nvml() -> FakeNVML:
    return FakeNVML(
        [
            ("GPU-bbbb", 16 * GiB, 3 * GiB),
            ("GPU-aaaa", 80 * GiB, 70 * GiB),
            ("MIG-cccc", 10 * GiB, 9 * GiB),
            ("MIG-dddd", 20 * GiB, 5 * GiB),
        ]
    )


def make(nvml: FakeNVML, index: int = 0) -> NVMLProbe:
    return NVMLProbe(index, nvml=nvml, uuid_of=TORCH_UUIDS.__getitem__)  # type: ignore[arg-type]


# --------------------------------------------------------------------------------------------
# NVMLProbe
# --------------------------------------------------------------------------------------------


def test_nvml_maps_torch_index_by_uuid_not_nvml_index(nvml: FakeNVML) -> None:
    with make(nvml, 0) as probe:
        reading = probe.read()
        assert (reading.total, reading.free, reading.source) == (80 * GiB, 70 * GiB, "nvml")
        assert probe.uuid == "GPU-aaaa" and probe.device == torch.device("cuda", 0)
    with make(nvml, 1) as probe:
        assert probe.read().total == 16 * GiB


def test_nvml_adds_gpu_prefix_when_torch_omits_it(nvml: FakeNVML) -> None:
    with make(nvml, 0):
        pass
    assert nvml.lookups[0] == "GPU-aaaa"
    nvml.lookups.clear()
    with NVMLProbe(0, nvml=nvml, uuid_of=lambda i: "GPU-aaaa") as probe:  # type: ignore[arg-type]
        assert probe.uuid == "GPU-aaaa"
    assert nvml.lookups == ["GPU-aaaa"]  # a prefixed UUID is used as is


def test_nvml_mig_instances(nvml: FakeNVML) -> None:
    # CUDA reports a MIG UUID with its prefix
    with make(nvml, 2) as probe:
        assert probe.uuid == "MIG-cccc"
        assert probe.read().total == 10 * GiB  # the instance's memory, not the GPU's
    # ... or bare: GPU-<uuid> is tried first, then MIG-<uuid>
    nvml.lookups.clear()
    with make(nvml, 3) as probe:
        assert probe.uuid == "MIG-dddd"
        assert probe.read().free == 5 * GiB
    assert nvml.lookups == ["GPU-dddd", "MIG-dddd"]


def test_nvml_mig_instance_nvml_cannot_find(nvml: FakeNVML) -> None:
    with pytest.raises(ProbeUnavailable, match=r"MIG instance MIG-zzzz.*cuda:0.*NVMLError_NotFound"):
        NVMLProbe(0, nvml=nvml, uuid_of=lambda i: "MIG-zzzz")  # type: ignore[arg-type]
    with pytest.raises(ProbeUnavailable, match=r"GPU-zzzz.*MIG-zzzz"):
        NVMLProbe(0, nvml=nvml, uuid_of=lambda i: "zzzz")  # type: ignore[arg-type]
    assert nvml.init_calls == nvml.shutdown_calls == 2  # each failed probe gave NVML back
    with pytest.raises(ProbeUnavailable, match="KeyError"):
        NVMLProbe(9, nvml=nvml, uuid_of=TORCH_UUIDS.__getitem__)  # type: ignore[arg-type]


@pytest.mark.parametrize("stage", ["nvmlInit", "nvmlDeviceGetHandleByUUID", "nvmlDeviceGetMemoryInfo"])
@pytest.mark.parametrize("error", ERRORS, ids=lambda e: e.__name__)
def test_nvml_errors_at_construction(nvml: FakeNVML, stage: str, error: type[Exception]) -> None:
    nvml.fail[stage] = error("boom")
    with pytest.raises(ProbeUnavailable, match=error.__name__) as info:
        make(nvml)
    assert isinstance(info.value.__cause__, error) or error is NVMLError_NotFound
    assert nvml.init_calls == nvml.shutdown_calls  # NVML left as found
    assert nvml.init_calls == (0 if stage == "nvmlInit" else 1)


@pytest.mark.parametrize("error", ERRORS, ids=lambda e: e.__name__)
def test_nvml_errors_at_read(nvml: FakeNVML, error: type[Exception]) -> None:
    with make(nvml) as probe:
        nvml.fail["nvmlDeviceGetMemoryInfo"] = error("boom")
        with pytest.raises(ProbeUnavailable, match=rf"{error.__name__}: boom"):
            probe.read()
        del nvml.fail["nvmlDeviceGetMemoryInfo"]
        assert probe.read().free == 70 * GiB  # a transient failure does not poison the probe


def test_nvml_not_supported_message_explains_unified_memory(nvml: FakeNVML) -> None:
    nvml.fail["nvmlDeviceGetMemoryInfo"] = NVMLError_NotSupported("Not Supported")
    with pytest.raises(ProbeUnavailable, match="unified-memory"):
        make(nvml)


def test_nvml_init_once_shutdown_after_last_close(nvml: FakeNVML) -> None:
    first, second = make(nvml, 0), make(nvml, 1)
    assert nvml.init_calls == 1
    first.close()
    first.close()  # idempotent: must not count twice
    assert nvml.shutdown_calls == 0
    assert second.read().total == 16 * GiB  # still usable
    second.close()
    assert nvml.shutdown_calls == 1
    second.close()
    assert nvml.shutdown_calls == 1
    with pytest.raises(ProbeUnavailable, match="closed"):
        first.read()
    # a new probe starts NVML again
    with make(nvml):
        assert nvml.init_calls == 2
    assert nvml.shutdown_calls == 2


def test_nvml_reading_reflects_co_tenant(nvml: FakeNVML) -> None:
    with make(nvml, 0) as probe:
        before = probe.read()
        nvml.handle("GPU-aaaa").free -= 30 * GiB  # another process allocates 30 GiB
        after = probe.read()
    assert before.free - after.free == 30 * GiB
    assert after.used == 40 * GiB and after.free_fraction == pytest.approx(40 / 80)


def test_nvml_lists_each_process_memory_and_reads_free_memory_without_listing(nvml: FakeNVML) -> None:
    handle = nvml.handle("GPU-aaaa")
    handle.processes = [
        types.SimpleNamespace(pid=11, usedGpuMemory=2 * GiB),
        types.SimpleNamespace(pid=12, usedGpuMemory=None),  # pynvml: not available (WDDM)
        types.SimpleNamespace(pid=11, usedGpuMemory=GiB),  # a second context of one process
    ]
    with make(nvml, 0) as probe:
        probe.read()
        assert nvml.listings == 0  # free memory is one call, not a listing
        assert probe.process_memory() == {11: 3 * GiB}
        nvml.fail["nvmlDeviceGetComputeRunningProcesses"] = NVMLError_NoPermission("denied")
        with pytest.raises(ProbeUnavailable, match="cannot list the processes of cuda:0"):
            probe.process_memory()
    with pytest.raises(ProbeUnavailable, match="closed"):
        probe.process_memory()
    assert ScriptedProbe([1], total=1).process_memory() is None  # a probe that cannot tell


def test_nvml_import_failure_and_cpu_device(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml -> ImportError
    with pytest.raises(ProbeUnavailable, match="nvidia-ml-py"):
        NVMLProbe(0, uuid_of=lambda i: "aaaa")
    with pytest.raises(ValueError, match="CUDA"):
        NVMLProbe(torch.device("cpu"), uuid_of=lambda i: "aaaa")


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_nvml_default_uuid_lookup_without_cuda(nvml: FakeNVML) -> None:
    with pytest.raises(ProbeUnavailable, match="CUDA is not available"):
        NVMLProbe(0, nvml=nvml)
    assert nvml.init_calls == 0


# --------------------------------------------------------------------------------------------
# CudaProbe
# --------------------------------------------------------------------------------------------


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_cuda_probe_unavailable_without_cuda() -> None:
    with pytest.raises(ProbeUnavailable, match="CUDA is not available"):
        CudaProbe()


def test_cuda_probe_with_mem_get_info(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[Any] = []
    state: dict[str, Any] = {"free": 6 * GiB, "error": None}

    def mem_get_info(device: Any = None) -> tuple[int, int]:
        calls.append(device)
        if state["error"] is not None:
            raise state["error"]
        return state["free"], 8 * GiB

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "mem_get_info", mem_get_info)
    probe = CudaProbe("cuda:1")
    assert probe.device == torch.device("cuda", 1)
    reading = probe.read()
    assert (reading.total, reading.free, reading.source) == (8 * GiB, 6 * GiB, "cuda")
    state["free"] = 2 * GiB  # a co-tenant allocates
    assert probe.read().free == 2 * GiB
    assert calls and all(device == 1 for device in calls)
    state["error"] = RuntimeError("CUDA error: an illegal memory access was encountered")
    with pytest.raises(ProbeUnavailable, match="RuntimeError: CUDA error"):
        probe.read()
    with pytest.raises(ProbeUnavailable, match="RuntimeError: CUDA error"):
        CudaProbe(0)  # construction reads once
    probe.close()
    with pytest.raises(ProbeUnavailable, match="closed"):
        probe.read()
    with pytest.raises(ValueError, match="CUDA"):
        CudaProbe("cpu")


# --------------------------------------------------------------------------------------------
# HostMemoryProbe
# --------------------------------------------------------------------------------------------

MEMINFO = "MemTotal:       16000000 kB\nMemFree:         2000000 kB\nMemAvailable:    8000000 kB\n"


def host(tmp_path: Path, cgroup: str | None, meminfo: str | None = MEMINFO) -> HostMemoryProbe:
    if meminfo is not None:
        (tmp_path / "meminfo").write_text(meminfo)
    if cgroup is not None:
        (tmp_path / "self_cgroup").write_text(cgroup)
    return HostMemoryProbe(
        meminfo=tmp_path / "meminfo", cgroup_root=tmp_path / "cg", self_cgroup=tmp_path / "self_cgroup"
    )


def cgroup_dir(tmp_path: Path, rel: str, **files: str) -> Path:
    directory = tmp_path / "cg" / rel
    directory.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (directory / name.replace("_", ".", 1)).write_text(text)
    return directory


def test_host_plain_meminfo(tmp_path: Path) -> None:
    reading = host(tmp_path, cgroup=None).read()
    assert (reading.total, reading.free, reading.source) == (16_000_000 * KiB, 8_000_000 * KiB, "host")


def test_host_meminfo_without_memavailable_uses_memfree(tmp_path: Path) -> None:
    reading = host(tmp_path, None, meminfo="MemTotal: 1000 kB\nMemFree: 300 kB\n").read()
    assert (reading.total, reading.free) == (1000 * KiB, 300 * KiB)


def test_host_cgroup_v2_limit(tmp_path: Path) -> None:
    directory = cgroup_dir(tmp_path, "job.slice/job1", memory_max=str(4 * GiB), memory_current=str(GiB))
    probe = host(tmp_path, "0::/job.slice/job1\n")
    reading = probe.read()
    assert (reading.total, reading.free) == (4 * GiB, 3 * GiB)
    # the cgroup's usage grows (another process of the job): free shrinks
    (directory / "memory.current").write_text(str(3 * GiB + GiB // 2))
    assert probe.read().free == GiB // 2
    # over the limit: nothing free, never negative
    (directory / "memory.current").write_text(str(5 * GiB))
    assert probe.read().free == 0
    # a generous limit: MemAvailable is the tighter bound
    (directory / "memory.max").write_text(str(100 * GiB))
    (directory / "memory.current").write_text(str(GiB))
    assert probe.read().total == 16_000_000 * KiB and probe.read().free == 8_000_000 * KiB


def test_host_cgroup_v2_limit_on_an_ancestor(tmp_path: Path) -> None:
    cgroup_dir(tmp_path, "", memory_max=str(6 * GiB), memory_current=str(5 * GiB))
    cgroup_dir(tmp_path, "a", memory_max="max\n", memory_current=str(2 * GiB))
    cgroup_dir(tmp_path, "a/b", memory_max="max\n", memory_current=str(GiB))
    reading = host(tmp_path, "0::/a/b\n").read()
    assert (reading.total, reading.free) == (6 * GiB, GiB)


def test_host_cgroup_v2_unlimited(tmp_path: Path) -> None:
    cgroup_dir(tmp_path, "job", memory_max="max\n", memory_current=str(15 * GiB))
    reading = host(tmp_path, "0::/job\n").read()
    assert (reading.total, reading.free) == (16_000_000 * KiB, 8_000_000 * KiB)


@pytest.mark.parametrize(
    "cgroup",
    [
        None,  # no /proc/self/cgroup
        "0::/job\n",  # cgroup v2 path without files
        "0::/../outside\n",  # outside this namespace's view
        "garbage\n",
    ],
)
def test_host_missing_cgroup_files_fall_back_silently(
    tmp_path: Path, cgroup: str | None, recwarn: pytest.WarningsRecorder
) -> None:
    reading = host(tmp_path, cgroup).read()
    assert (reading.total, reading.free) == (16_000_000 * KiB, 8_000_000 * KiB)
    assert len(recwarn) == 0


def test_host_unreadable_cgroup_values_ignored(tmp_path: Path) -> None:
    cgroup_dir(tmp_path, "job", memory_max="not a number\n", memory_current="1\n")
    reading = host(tmp_path, "0::/job\n").read()
    assert reading.total == 16_000_000 * KiB


def test_host_cgroup_v1_limit(tmp_path: Path) -> None:
    cgroup_dir(
        tmp_path, "memory/docker/abc", memory_limit_in_bytes=str(2 * GiB), memory_usage_in_bytes=str(GiB)
    )
    reading = host(tmp_path, "5:cpu:/\n4:memory:/docker/abc\n0::/\n").read()
    assert (reading.total, reading.free) == (2 * GiB, GiB)
    # v1 writes "no limit" as ~2**63
    cgroup_dir(tmp_path, "memory/docker/abc", memory_limit_in_bytes="9223372036854771712")
    assert host(tmp_path, "4:memory:/docker/abc\n").read().total == 16_000_000 * KiB


def test_host_missing_meminfo(tmp_path: Path) -> None:
    with pytest.raises(ProbeUnavailable, match="meminfo"):
        host(tmp_path, None, meminfo=None)
    with pytest.raises(ProbeUnavailable, match="MemTotal"):
        host(tmp_path, None, meminfo="MemFree: 10 kB\n")
    probe = host(tmp_path, None)
    (tmp_path / "meminfo").unlink()
    with pytest.raises(ProbeUnavailable, match="cannot read"):
        probe.read()


@pytest.mark.skipif(not Path("/proc/meminfo").exists(), reason="needs Linux /proc/meminfo")
def test_host_real_machine() -> None:
    with HostMemoryProbe() as probe:
        reading = probe.read()
    assert reading.source == "host"
    assert reading.free > 0 and reading.total >= reading.free


# --------------------------------------------------------------------------------------------
# ScriptedProbe and MemoryReading
# --------------------------------------------------------------------------------------------


def test_scripted_sequence_holds_last_value() -> None:
    probe = ScriptedProbe((900, 100, 500), total=1000)
    assert [probe.read().free for _ in range(5)] == [900, 100, 500, 500, 500]
    assert probe.reads == 5
    assert probe.read().source == "scripted" and probe.read().total == 1000


def test_scripted_callable() -> None:
    seen: list[int] = []

    def trace(i: int) -> int:
        seen.append(i)
        return 1000 - 100 * i

    probe = ScriptedProbe(trace, total=1000)
    assert [probe.read().free for _ in range(3)] == [1000, 900, 800]
    assert seen == [0, 1, 2] and probe.reads == 3
    bad = ScriptedProbe(lambda i: 2000, total=1000)
    with pytest.raises(ValueError, match=r"free\(0\).*more than total=1000"):
        bad.read()
    assert bad.reads == 0


@pytest.mark.parametrize(
    ("free", "total", "error", "message"),
    [
        ([], 1000, ValueError, "non-empty"),
        ([10, -1], 1000, ValueError, r"free\[1\] must be >= 0"),
        ([10, 1001], 1000, ValueError, r"free\[1\] is 1001 bytes, more than total=1000"),
        ([1.5], 1000, TypeError, r"free\[0\] must be an int >= 0, got 1.5"),
        ([10], 0, ValueError, r"total must be >= 1, got 0"),
        ([10], 10.0, TypeError, r"total must be an int >= 1, got 10.0"),
    ],
)
def test_scripted_bad_input(free: list[Any], total: int, error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=message):
        ScriptedProbe(free, total=total)


def test_scripted_from_csv(tmp_path: Path) -> None:
    with_total = tmp_path / "with_total.csv"
    with_total.write_text("step,free,total\n0,900,1000\n1,400,1000\n\n2,1.5e2,1000\n")
    probe = ScriptedProbe.from_csv(with_total)
    assert probe.total == 1000
    assert [probe.read().free for _ in range(4)] == [900, 400, 150, 150]
    assert ScriptedProbe.from_csv(with_total, total=2000).read().total == 2000

    without_total = tmp_path / "without_total.csv"
    without_total.write_text(" free \n300\n200\n")
    with pytest.raises(ValueError, match="no 'total' column"):
        ScriptedProbe.from_csv(without_total)
    probe = ScriptedProbe.from_csv(without_total, total=500)
    assert [probe.read().free for _ in range(2)] == [300, 200]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "empty file"),
        ("step,used\n0,1\n", "no 'free' column"),
        ("free,total\n", "trace is empty"),
        ("free,total\n-5,100\n", "must be >= 0"),
        ("free,total\n500,100\n", "more than total=100"),
        ("free,total\nlots,100\n", ":2 free is not a number"),
        ("free,total\n,100\n", ":2 free is empty"),
    ],
)
def test_scripted_from_csv_bad_files(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "trace.csv"
    path.write_text(text)
    with pytest.raises(ValueError, match=message):
        ScriptedProbe.from_csv(path)


def test_memory_reading() -> None:
    reading = MemoryReading(total=8, free=2, source="scripted")
    assert (reading.used, reading.free_fraction) == (6, 0.25)
    assert MemoryReading(total=0, free=0, source="cuda").free_fraction == 0.0
    with pytest.raises(ValueError, match="0 <= free <= total"):
        MemoryReading(total=8, free=9, source="nvml")
    with pytest.raises(ValueError, match="0 <= free <= total"):
        MemoryReading(total=8, free=-1, source="nvml")
    with pytest.raises(TypeError, match=r"total must be an int, got 8.0"):
        MemoryReading(total=8.0, free=1, source="nvml")  # type: ignore[arg-type]
    with pytest.raises(AttributeError):
        reading.free = 3  # type: ignore[misc]
    assert reading.own is None and MemoryReading(total=8, free=2, source="budget", own=5).own == 5
    with pytest.raises(ValueError, match="own must be >= 0, got -1"):
        MemoryReading(total=8, free=2, source="budget", own=-1)
    with pytest.raises(TypeError, match="own must be an int >= 0, got True"):
        MemoryReading(total=8, free=2, source="budget", own=True)
    assert MemoryReading(total=8, free=2, source="budget", own=5, own_base=3).own_base == 3
    with pytest.raises(ValueError, match="own_base <= own .* got own_base=6, own=5"):
        MemoryReading(total=8, free=2, source="budget", own=5, own_base=6)
    with pytest.raises(ValueError, match="own_base <= own .* got own_base=1, own=None"):
        MemoryReading(total=8, free=2, source="budget", own_base=1)  # a step's start needs its peak
    with pytest.raises(ValueError, match="own_base must be >= 0, got -1"):
        MemoryReading(total=8, free=2, source="budget", own=5, own_base=-1)


def test_memory_reading_accepts_integer_scalars_that_are_not_int() -> None:
    np = pytest.importorskip("numpy")
    reading = MemoryReading(total=np.int64(8), free=torch.tensor(2), source="scripted")
    assert (reading.total, reading.free) == (8, 2) and type(reading.total) is int
    assert ScriptedProbe(np.array([5, 3]), total=np.int32(10)).read().free == 5


def test_exports() -> None:
    # every exported name is importable, public and documented; the names users rely on are there
    for name in memory.__all__:
        exported = getattr(memory, name)
        assert not name.startswith("_") and (exported.__doc__ or "").strip(), name
    assert set(memory.__all__) >= {
        "CudaProbe",
        "HostMemoryProbe",
        "MemoryProbe",
        "MemoryReading",
        "NVMLProbe",
        "ProbeUnavailable",
        "ScriptedProbe",
        "SharedBudgetProbe",
        "CoTenant",
        "RampTrace",
        "auto_probe",
    }
    assert all(issubclass(c, MemoryProbe) for c in (NVMLProbe, CudaProbe, HostMemoryProbe, ScriptedProbe))
    assert issubclass(memory.SharedBudgetProbe, MemoryProbe)
    assert issubclass(ProbeUnavailable, RuntimeError)


# --------------------------------------------------------------------------------------------
# auto_probe
# --------------------------------------------------------------------------------------------


def user_warnings(recorded: list[warnings.WarningMessage]) -> list[str]:
    return [str(w.message) for w in recorded if issubclass(w.category, UserWarning)]


def test_auto_probe_cpu_no_warning(recwarn: pytest.WarningsRecorder) -> None:
    probe = auto_probe("cpu")
    assert isinstance(probe, HostMemoryProbe)
    probe.close()
    assert len(recwarn) == 0


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_auto_probe_default_without_cuda_is_host(recwarn: pytest.WarningsRecorder) -> None:
    assert isinstance(auto_probe(), HostMemoryProbe)
    assert len(recwarn) == 0


@pytest.fixture
def fake_cuda(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """CUDA 'available' with device 0 of UUID aaaa; mem_get_info controllable."""
    state: dict[str, Any] = {"mem_get_info": lambda device=None: (3 * GiB, 8 * GiB)}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: types.SimpleNamespace(uuid="aaaa"))
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: state["mem_get_info"](device))
    return state


def test_auto_probe_cuda_prefers_nvml(
    monkeypatch: pytest.MonkeyPatch, fake_cuda: dict[str, Any], nvml: FakeNVML
) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    with warnings.catch_warnings(record=True) as recorded:
        warnings.simplefilter("always")
        probe = auto_probe(0)
    assert isinstance(probe, NVMLProbe) and probe.read().total == 80 * GiB
    probe.close()
    assert user_warnings(recorded) == []


def test_auto_probe_cuda_falls_back_with_one_warning(
    monkeypatch: pytest.MonkeyPatch, fake_cuda: dict[str, Any], nvml: FakeNVML
) -> None:
    nvml.fail["nvmlInit"] = NVMLError_LibraryNotFound("NVML Shared Library Not Found")
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    with warnings.catch_warnings(record=True) as recorded:
        warnings.simplefilter("always")
        probe = auto_probe("cuda:0")
    assert isinstance(probe, CudaProbe)
    assert probe.read().free == 3 * GiB
    messages = user_warnings(recorded)
    assert len(messages) == 1 and len(recorded) == 1
    assert "cuda:0" in messages[0] and "NVMLError_LibraryNotFound" in messages[0]
    assert "mem_get_info" in messages[0]


def test_auto_probe_cuda_falls_back_when_nvml_cannot_measure(
    monkeypatch: pytest.MonkeyPatch, fake_cuda: dict[str, Any], nvml: FakeNVML
) -> None:
    nvml.fail["nvmlDeviceGetMemoryInfo"] = NVMLError_NotSupported("Not Supported")  # unified memory
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    with pytest.warns(UserWarning, match="NVMLError_NotSupported") as recorded:
        probe = auto_probe("cuda:0")
    assert isinstance(probe, CudaProbe) and len(recorded) == 1
    assert nvml.init_calls == nvml.shutdown_calls == 1


def test_auto_probe_cuda_both_fail_returns_none_with_one_warning(
    monkeypatch: pytest.MonkeyPatch, fake_cuda: dict[str, Any], nvml: FakeNVML
) -> None:
    def broken(device: Any) -> tuple[int, int]:
        raise RuntimeError("CUDA driver version is insufficient")

    fake_cuda["mem_get_info"] = broken
    nvml.fail["nvmlInit"] = NVMLError_DriverNotLoaded("Driver Not Loaded")
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    with warnings.catch_warnings(record=True) as recorded:
        warnings.simplefilter("always")
        assert auto_probe("cuda:0") is None
    messages = user_warnings(recorded)
    assert len(recorded) == 1 and len(messages) == 1
    assert "NVMLError_DriverNotLoaded" in messages[0] and "driver version is insufficient" in messages[0]


def test_auto_probe_replaced_nvml_class(monkeypatch: pytest.MonkeyPatch, fake_cuda: dict[str, Any]) -> None:
    def no_nvml(*args: Any, **kwargs: Any) -> NVMLProbe:
        raise ProbeUnavailable("NVMLError_NoPermission: Insufficient Permissions")

    monkeypatch.setattr(probes_module, "NVMLProbe", no_nvml)
    with pytest.warns(UserWarning, match="NoPermission") as recorded:
        probe = auto_probe(torch.device("cuda", 0))
    assert isinstance(probe, CudaProbe) and len(recorded) == 1


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_auto_probe_cuda_without_cuda_returns_none(recwarn: pytest.WarningsRecorder) -> None:
    assert auto_probe("cuda:0") is None
    assert len(recwarn) == 1 and "disabled" in str(recwarn[0].message)


def test_auto_probe_host_failure_returns_none_with_one_warning(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    class NoHost(HostMemoryProbe):
        def __init__(self) -> None:
            super().__init__(meminfo=tmp_path / "missing")

    monkeypatch.setattr(probes_module, "HostMemoryProbe", NoHost)
    with warnings.catch_warnings(record=True) as recorded:
        warnings.simplefilter("always")
        assert auto_probe("cpu") is None
    assert len(recorded) == 1 and "missing" in str(recorded[0].message)


def test_auto_probe_other_device_types(recwarn: pytest.WarningsRecorder) -> None:
    assert auto_probe("meta") is None
    assert len(recwarn) == 1 and "'meta'" in str(recwarn[0].message)
    with pytest.raises(ValueError, match="not a device"):
        auto_probe("gpu:zero")
    with pytest.raises(TypeError):
        auto_probe(1.5)  # type: ignore[arg-type]
