"""What a check of :class:`~lightning_bandlimit.callbacks.AdaptiveBandLimit` reads of the device
and the job (:func:`read_job`, :class:`JobMemory`): free memory, the job's own peak and what it
held at that step's start (metered on the step by
:class:`~lightning_bandlimit.callbacks.ladder_step_peak.StepPeak` where the probe does not
measure the job), and what the job holds now (:func:`held_bytes`). A probe that fails, in any
way, skips that check and, :data:`PROBE_FAILURES_TO_STOP` checks in a row, is read no more
(:class:`ProbeReader`); a probe's list of the device's processes is checked the same way
(:func:`process_memory`).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from lightning.pytorch.utilities import rank_zero_warn

from lightning_bandlimit.memory.protocol import (
    InvalidReading,
    MemoryProbe,
    MemoryReading,
    ProbeUnavailable,
    check_process_memory,
    check_reading,
    describe_error,
)

__all__ = ["PROBE_FAILURES_TO_STOP", "JobMemory", "ProbeReader", "held_bytes", "process_memory", "read_job"]

# Checks in a row with a failing probe after which it is read no more. One failure is often
# passing (a driver call interrupted, a /proc or cgroup file read as it is rewritten, a custom
# probe's bad sample): it skips only its check, the levers staying where they are. Three in a
# row (by default 30 steps) is a probe that is broken, not unlucky: reading it on would only
# repeat the failure at every check, and the job, whose levers stay, is no worse off without it.
PROBE_FAILURES_TO_STOP = 3


class JobMemory(NamedTuple):
    """What a check reads of the device and the job (:func:`read_job`)."""

    reading: MemoryReading
    peak: int | None  # the job's peak on its last measured step(s); None: not measured
    base: int | None = None  # what the job held at that step's start; None: not measured


def held_bytes(probe: MemoryProbe | None, device: torch.device | None) -> int:
    """What the job holds now, in the unit of the peak :func:`read_job` reads: the probe's
    measurement of the job when it has one, else ``torch.cuda.memory_allocated`` on a GPU, else
    ``0`` (the metered peak is the step's saved bytes alone, or the probe stopped working)."""
    if probe is not None and probe.measures_own:
        try:
            return int(check_reading(probe.read()).own or 0)
        except Exception:  # noqa: BLE001 -- any failing probe (ProbeReader): the ladder's next check says so
            return 0
    if device is not None and device.type == "cuda":
        return int(torch.cuda.memory_allocated(device))
    return 0


def read_job(
    probe: MemoryProbe, device: torch.device | None, metered_peak: int | None, metered_base: int | None = None
) -> JobMemory:
    """The device's free memory, the job's peak on its last step and what it held at that step's
    start: the probe's measurement of the job when it has one (with its
    :attr:`~lightning_bandlimit.memory.MemoryReading.own_base`), else
    ``torch.cuda.max_memory_allocated`` on a GPU (with ``metered_base``, what was allocated at the
    step's start), else the bytes the step saved for backward (``metered_peak``: an increment,
    no base).

    Raises:
        ProbeUnavailable: if the probe stopped working (:class:`InvalidReading`: if its reading
            fails :func:`check_reading`); a probe that breaks its protocol may raise anything.
    """
    reading = check_reading(probe.read())
    if reading.own is not None:  # the probe measured the job itself: learn what it counts
        return JobMemory(reading, reading.own, reading.own_base)
    if device is not None and device.type == "cuda":
        peak = int(torch.cuda.max_memory_allocated(device))
        return JobMemory(reading, peak, None if metered_base is None else min(metered_base, peak))
    return JobMemory(reading, metered_peak)


class ProbeReader:
    """Reads a job's probe at each check (:func:`read_job`), any failure of the probe (an error of
    any type, an invalid reading) taken as :class:`ProbeUnavailable` for that check: the check is
    skipped, said once per cause (the error's type, or the reading's problem) naming the probe
    and the error; the ``stop_after``-th failure in a row is said once and :attr:`stopped` set,
    so the caller reads the probe no more.

    Attributes:
        failures: the failed reads in a row, so far.
        stopped: whether the last :meth:`read` was the ``stop_after``-th failure in a row (then
            ``failures`` starts again from 0, for a next probe).

    Example:
        >>> import warnings
        >>> from lightning_bandlimit.memory import ScriptedProbe
        >>> class Flaky(ScriptedProbe):
        ...     def read(self):
        ...         if self.reads in (1, 3, 4, 5):
        ...             self.reads += 1
        ...             raise OSError("sensor busy")
        ...         return super().read()
        >>> reader, probe = ProbeReader("Job"), Flaky([600], total=1000)
        >>> with warnings.catch_warnings(record=True) as said:
        ...     warnings.simplefilter("always")
        ...     reads = [reader.read(probe, None, None) for _ in range(6)]
        >>> [r is not None for r in reads], reader.stopped
        ([True, False, True, False, False, False], True)
        >>> for warning in said:  # doctest: +ELLIPSIS
        ...     print(warning.message)
        Job: the memory probe Flaky failed (OSError: sensor busy); this check is skipped, ...
        Job: the memory probe Flaky stopped working: 3 checks in a row failed (last: OSError: ...
    """

    def __init__(self, owner: str, stop_after: int = PROBE_FAILURES_TO_STOP) -> None:
        self.owner = owner
        self.stop_after = stop_after
        self.failures = 0
        self.stopped = False
        self._said: set[str] = set()

    def read(
        self,
        probe: MemoryProbe,
        device: torch.device | None,
        metered_peak: int | None,
        metered_base: int | None = None,
    ) -> JobMemory | None:
        """:func:`read_job`, or ``None``: the probe failed, the check is skipped."""
        self.stopped = False
        try:
            read = read_job(probe, device, metered_peak, metered_base)
        except Exception as error:  # noqa: BLE001 -- any failure of a probe is its being unavailable
            self._failed(type(probe).__name__, error)
            return None
        self.failures = 0
        return read

    def _failed(self, name: str, error: Exception) -> None:
        self.failures += 1
        if self.failures >= self.stop_after:
            self.failures, self.stopped = 0, True
            rank_zero_warn(
                f"{self.owner}: the memory probe {name} stopped working: {self.stop_after} checks in a "
                f"row failed (last: {describe_error(error)}); it is read no more, the levers stay as they are"
            )
            return
        cause = error.problem if isinstance(error, InvalidReading) else type(error).__name__
        if cause not in self._said:
            self._said.add(cause)
            rank_zero_warn(
                f"{self.owner}: the memory probe {name} failed ({describe_error(error)}); this check is "
                "skipped, the levers stay as they are"
            )


def process_memory(probe: MemoryProbe) -> dict[int, int] | None:
    """``probe.process_memory()`` checked (:func:`check_process_memory`), any failure of the probe
    raised as :class:`ProbeUnavailable`.

    Raises:
        ProbeUnavailable: if the probe cannot list the device's processes, in any way.

    Example:
        >>> from lightning_bandlimit.memory import ScriptedProbe
        >>> class Garbled(ScriptedProbe):
        ...     def process_memory(self):
        ...         return {1: -5}
        >>> process_memory(Garbled([1], total=1))  # doctest: +ELLIPSIS
        Traceback (most recent call last):
            ...
        lightning_bandlimit.memory.protocol.ProbeUnavailable: the memory probe Garbled cannot list ...
    """
    try:
        return check_process_memory(probe.process_memory())
    except ProbeUnavailable as error:
        if not isinstance(error, InvalidReading):
            raise
        cause: Exception = error
    except Exception as error:  # noqa: BLE001 -- any failure of a probe is its being unavailable
        cause = error
    name = type(probe).__name__
    raise ProbeUnavailable(
        f"the memory probe {name} cannot list the device's processes ({describe_error(cause)})"
    ) from cause
