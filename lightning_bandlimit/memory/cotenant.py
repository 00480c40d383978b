"""A co-tenant: a second, real process whose host memory follows targets it is sent.

The multi-tenant benchmark and the main job run a training job beside one. The co-tenant is a
bare Python interpreter (no torch: its resident set is its memory plus about 10 MiB) that holds
touched chunks of memory; each target it is sent is answered with its resident set, measured
by itself in ``/proc``. :class:`RampTrace` is the shape it follows: low, a ramp up, a hold, and
back to low when it leaves.
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from types import TracebackType

from typing_extensions import Self

from lightning_bandlimit.utils.units import MIB
from lightning_bandlimit.utils.validation import check_int

__all__ = ["CoTenant", "RampTrace"]

# The co-tenant's whole program: one integer target per line in, one resident size per line out.
_SERVER = r"""
import sys
PAGE, CHUNK = 4096, int(sys.argv[1])
chunks = []
def rss():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return -1
print(rss(), flush=True)
for line in sys.stdin:
    target = int(line)
    while len(chunks) * CHUNK < target:
        block = bytearray(CHUNK)
        block[::PAGE] = b"\x01" * len(range(0, CHUNK, PAGE))  # touch every page: resident
        chunks.append(block)
    while chunks and len(chunks) * CHUNK > target:
        chunks.pop()
    print(rss(), flush=True)
"""


class CoTenant:
    """A second process holding ``target`` bytes of host memory, moved with :meth:`hold`.

    Memory is held in chunks of ``chunk_bytes``, every page touched (resident, not just
    reserved). A context manager: leaving it ends the process.

    Args:
        chunk_bytes: granularity of the held memory, at least one page (4096).

    Raises:
        TypeError: if ``chunk_bytes`` is not an int.
        ValueError: if ``chunk_bytes`` is below 4096.
        OSError: if the process cannot start (e.g. ``/proc`` is missing: not Linux).

    Example:
        >>> with CoTenant() as other:
        ...     idle = other.resident
        ...     grown = other.hold(64 * MIB)
        >>> grown - idle >= 60 * MIB
        True
    """

    def __init__(self, chunk_bytes: int = MIB) -> None:
        check_int("chunk_bytes", chunk_bytes, minimum=4096)  # one page
        self._process = subprocess.Popen(
            [sys.executable, "-S", "-c", _SERVER, str(int(chunk_bytes))],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            bufsize=1,
        )
        self.target = 0
        self.resident = self._answer()

    @property
    def pid(self) -> int:
        """The co-tenant's process id."""
        return self._process.pid

    def _answer(self) -> int:
        assert self._process.stdout is not None
        line = self._process.stdout.readline()
        if not line or int(line) < 0:
            code = self._process.poll()
            raise OSError(
                f"the co-tenant process stopped answering (exit code {code}); it reads /proc/self/status"
            )
        return int(line)

    def hold(self, target: int) -> int:
        """Grow or shrink to about ``target`` bytes held; returns the resident set after it.

        Raises:
            TypeError: for a target that is not an int.
            ValueError: for a negative target.
            OSError: if the process has stopped.
        """
        check_int("target", target, minimum=0)
        if self._process.poll() is not None:
            raise OSError(f"the co-tenant process has exited (code {self._process.returncode})")
        assert self._process.stdin is not None
        self._process.stdin.write(f"{int(target)}\n")
        self._process.stdin.flush()
        self.target = int(target)
        self.resident = self._answer()
        return self.resident

    def close(self) -> None:
        """End the process (idempotent)."""
        if self._process.poll() is None:
            assert self._process.stdin is not None
            self._process.stdin.close()
            try:
                self._process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
        if self._process.stdout is not None:
            self._process.stdout.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


@dataclass(frozen=True)
class RampTrace:
    """A co-tenant's memory over a run: ``low``, a linear ramp to ``high``, a hold, back to ``low``.

    Args:
        low: bytes held before it grows and after it leaves.
        high: bytes held at its peak.
        start: fraction of the run where the ramp starts.
        ramp: fraction of the run the ramp lasts.
        leave: fraction of the run where it drops back to ``low``.

    Raises:
        ValueError: unless ``0 <= low <= high`` and ``0 <= start``, ``0 < ramp``,
            ``start + ramp <= leave <= 1``.

    Example:
        >>> trace = RampTrace(low=100, high=300, start=0.25, ramp=0.2, leave=0.7)
        >>> [trace(f) for f in (0.0, 0.35, 0.5, 0.8)]
        [100, 200, 300, 100]
    """

    low: int
    high: int
    start: float = 0.25
    ramp: float = 0.2
    leave: float = 0.7

    def __post_init__(self) -> None:
        if not 0 <= self.low <= self.high:
            raise ValueError(f"RampTrace needs 0 <= low <= high, got low={self.low}, high={self.high}")
        if not (0 <= self.start and 0 < self.ramp and self.start + self.ramp <= self.leave <= 1):
            raise ValueError(
                "RampTrace needs 0 <= start, 0 < ramp and start + ramp <= leave <= 1, got "
                f"start={self.start}, ramp={self.ramp}, leave={self.leave}"
            )

    def __call__(self, fraction: float) -> int:
        """Bytes held at ``fraction`` (0 to 1) of the run."""
        if fraction >= self.leave:
            return self.low
        rise = min(max((fraction - self.start) / self.ramp, 0.0), 1.0)
        return int(round(self.low + (self.high - self.low) * rise))
