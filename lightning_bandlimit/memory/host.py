"""The host probe: free host memory for a CPU job, ``/proc/meminfo`` bounded by its cgroup.

Example:
    >>> probe = HostMemoryProbe()  # Linux
    >>> reading = probe.read()
    >>> reading.source, 0 < reading.free <= reading.total
    ('host', True)
"""

from __future__ import annotations

from pathlib import Path, PurePosixPath

from lightning_bandlimit.memory.protocol import MemoryProbe, MemoryReading, ProbeUnavailable, describe_error

__all__ = ["HostMemoryProbe"]

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
            raise ProbeUnavailable(f"cannot read {self.meminfo} ({describe_error(err)})") from err
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
