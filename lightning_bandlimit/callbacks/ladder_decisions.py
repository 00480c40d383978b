"""What :class:`~lightning_bandlimit.callbacks.AdaptiveBandLimit` decides from and what it keeps.

* What a check reads (:func:`read_job`, :class:`JobMemory`): free memory, the job's own peak
  and what it held at that step's start (metered on the step by :class:`StepPeak` where the
  probe does not measure the job); the growth of the latter is reported once when it is large
  (:class:`BaselineDrift`); a probe that fails, in
  any way, skips that check and, :data:`PROBE_FAILURES_TO_STOP` checks in a row, is read no
  more (:class:`ProbeReader`).
* Under DDP the ranks agree on the inputs of a decision (:func:`agree_across_ranks`,
  :class:`Agreed`), so their controllers, fed the same, take the same decision on the same step.
* Each decision (and each out-of-memory retry) is kept as a record (:func:`decision_record`) in
  the callback's ``decisions`` and logged (:func:`log_decision`).
* What may decide beside the ladder (:class:`Coordinator`: other jobs on the device).
"""

from __future__ import annotations

from typing import Any, NamedTuple, Protocol

import lightning.pytorch as pl
import torch
from lightning.pytorch.utilities import rank_zero_warn

from lightning_bandlimit.ladder.controller import LadderController
from lightning_bandlimit.ladder.reasons import REASON_CODES
from lightning_bandlimit.ladder.setting import Decision, Setting
from lightning_bandlimit.memory.protocol import (
    InvalidReading,
    MemoryProbe,
    MemoryReading,
    ProbeUnavailable,
    check_process_memory,
    check_reading,
    describe_error,
)
from lightning_bandlimit.recompute.saved_tensors import SavedTensorMeter
from lightning_bandlimit.utils.units import MIB

__all__ = [
    "Agreed",
    "BaselineDrift",
    "Coordinated",
    "Coordinator",
    "PROBE_FAILURES_TO_STOP",
    "JobMemory",
    "ProbeReader",
    "StepPeak",
    "agree_across_ranks",
    "decision_record",
    "describe_change",
    "held_bytes",
    "log_decision",
    "process_memory",
    "read_job",
]

# Checks in a row with a failing probe after which it is read no more. One failure is often
# passing (a driver call interrupted, a /proc or cgroup file read as it is rewritten, a custom
# probe's bad sample): it skips only its check, the levers staying where they are. Three in a
# row (by default 30 steps) is a probe that is broken, not unlucky: reading it on would only
# repeat the failure at every check, and the job, whose levers stay, is no worse off without it.
PROBE_FAILURES_TO_STOP = 3


class Coordinated(NamedTuple):
    """A check's decision after the jobs' shared rule (what :class:`Coordinator` returns)."""

    decision: Decision
    outside: bool = False  # a change the ladder did not decide: the callback tells the controller


class Coordinator(Protocol):
    """What decides beside a job's ladder for other memory-aware jobs on its device
    (:class:`~lightning_bandlimit.callbacks.SharedDevice`)."""

    def peer_memory(self) -> float | None:
        """The memory the other jobs published, bytes (``None``: not known for all of them),
        read before the ladder decides: their own changes are not others' growth."""

    def __call__(self, adaptive: pl.Callback, trainer: pl.Trainer, decision: Decision) -> Coordinated:
        """The check's decision (of ``adaptive``, the ``AdaptiveBandLimit``) after the shared rule."""

    def first_step_on_top(self) -> bool:
        """Whether the job's first step, which measures it, runs on the top rung rather than on
        rung 0 (it arrived beside peers)."""


class JobMemory(NamedTuple):
    """What a check reads of the device and the job (:func:`read_job`)."""

    reading: MemoryReading
    peak: int | None  # the job's peak on its last measured step(s); None: not measured
    base: int | None = None  # what the job held at that step's start; None: not measured


class StepPeak:
    """The job's peak on a check's step where the probe does not measure the job itself: on a
    GPU ``torch.cuda.max_memory_allocated`` from the step's start (read by :func:`read_job`),
    with ``torch.cuda.memory_allocated`` at the start as what the job held then, else the bytes
    the step saved for backward, from its start to its backward (an increment already).

    Attributes:
        bytes: the last metered peak (also what a profiling step measured); ``None``: none.
        base: on a GPU, the bytes allocated at the metered step's start; ``None``: not metered.

    Example:
        >>> import torch
        >>> peak = StepPeak()
        >>> peak.start(torch.device("cpu"), exclude=())
        >>> x = torch.ones(256, requires_grad=True)
        >>> y = (x * x).sum()  # saves x for backward (counted once): 1 KiB
        >>> peak.stop(); peak.bytes
        1024
    """

    def __init__(self) -> None:
        self.bytes: int | None = None
        self.base: int | None = None
        self._meter: SavedTensorMeter | None = None

    def start(self, device: torch.device | None, exclude: Any) -> None:
        """Meter the step starting now (``exclude``: tensors not counted, e.g. the parameters)."""
        if device is not None and device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
            self.base = int(torch.cuda.memory_allocated(device))
        else:
            self._meter = SavedTensorMeter(exclude=exclude).__enter__()

    def stop(self, profiled: int | None = None) -> None:
        """Stop metering (before the step's backward, or at its end); ``profiled``: the peak a
        profiling step measured, taken as the step's."""
        if profiled is not None:
            self.bytes = profiled
        if self._meter is not None:
            self._meter.__exit__(None, None, None)
            self.bytes, self._meter = self._meter.bytes, None


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


class Agreed(NamedTuple):
    """What every rank decides from (:func:`agree_across_ranks`)."""

    # the least free memory and total of any rank, the largest peak, and the largest peak less
    # the largest increment (base None unless every rank measured its step's start)
    measured: JobMemory
    top: int  # the lowest top rung of any rank
    continuum_on_top: bool  # on the top rung only if on every rank
    splits: int = 0  # the fewest micro-batch splits any rank has on its ladder


def agree_across_ranks(
    strategy: Any, controller: LadderController, mine: JobMemory | None, device: torch.device | None
) -> Agreed | None:
    """What every rank decides from: the least free memory and total, the largest peak, the
    largest step increment (peak less ``base``, what the rank held at the step's start; only
    when every rank measured it), the lowest top rung of any rank, and the continuum on the top
    rung only if every rank's blocks keep their spectrum, the fewest splits of any rank's ladder;
    ``None`` when any rank has no reading
    (``mine=None``: its probe failed or stopped), so that every rank skips the check together.
    One collective (``strategy.reduce`` with ``reduce_op="max"``); the caller gives the agreed
    top rung and continuum to its controller."""
    on_top = float(controller.continuum_on_top)
    reading, peak, base = (None, None, None) if mine is None else mine
    free, total = (0, 0) if reading is None else (reading.free, reading.total)
    measured = peak is not None and base is not None
    increment = float(peak - base) if measured else 0.0  # type: ignore[operator]
    vector = [-free, -total, float(peak or 0), -controller.top, -on_top, float(mine is None), increment]
    vector += [float(not measured), -float(len(controller.splits))]
    agreed = strategy.reduce(
        torch.tensor(vector, dtype=torch.float64, device=device), reduce_op="max"
    ).tolist()
    if agreed[5] > 0.5 or reading is None:
        return None
    total = int(round(-agreed[1]))
    agreed_reading = MemoryReading(
        total=total, free=min(int(round(-agreed[0])), total), source=reading.source
    )
    peak_agreed = int(agreed[2]) or None
    base_agreed = None
    if agreed[7] < 0.5 and peak_agreed is not None:
        base_agreed = max(0, peak_agreed - int(agreed[6]))
    memory = JobMemory(agreed_reading, peak_agreed, base_agreed)
    return Agreed(memory, int(round(-agreed[3])), -agreed[4] > 0.5, int(round(-agreed[8])))


def decision_record(
    step: int,
    rung: int,
    units: int,
    compression: float,
    reason: str,
    free: int | None = None,
    peak: int | None = None,
    slowdown: float | None = None,
    baseline: int | None = None,
    split: int = 1,
) -> dict[str, Any]:
    """One entry of ``AdaptiveBandLimit.decisions``: the setting after a check, and why
    (``baseline``: what the job held at its measured step's start; ``split``: the chunks a
    step's batch runs in)."""
    return {
        "step": step,
        "rung": rung,
        "split": split,
        "checkpointed_units": units,
        "compression": compression,
        "reason": reason,
        "free_bytes": free,
        "job_peak_bytes": peak,
        "slowdown": slowdown,
        "baseline_bytes": baseline,
    }


def log_decision(pl_module: pl.LightningModule, name: str, record: dict[str, Any]) -> None:
    """Log a check's record as ``{name}/free_bytes``, ``.../decision``, ``.../rung``,
    ``.../checkpointed_units``, ``.../split`` and, when known, ``.../slowdown``, ``.../job_peak_bytes`` and
    ``.../baseline_bytes``."""

    def log(key: str, value: float) -> None:
        pl_module.log(f"{name}/{key}", value, on_step=True, on_epoch=False)

    log("free_bytes", float(record["free_bytes"]))
    log("decision", REASON_CODES[record["reason"]])
    log("rung", float(record["rung"]))
    log("checkpointed_units", float(record["checkpointed_units"]))
    log("split", float(record.get("split", 1)))
    if record["slowdown"] is not None:
        log("slowdown", record["slowdown"])
    if record["job_peak_bytes"]:
        log("job_peak_bytes", float(record["job_peak_bytes"]))
    if record.get("baseline_bytes") is not None:
        log("baseline_bytes", float(record["baseline_bytes"]))


def describe_change(step: int, previous: Setting, decision: Decision, units: int) -> str:
    """A change of setting in one line: what moved, why, and the free memory it was decided at.

    Example:
        >>> describe_change(7, Setting(0, 0.0), Decision(2, 0.0, "raise", 3 * 2**20, 4 * 2**20), units=4)
        'step 7: rung 0 -> 2 (4 units checkpointed) (raise: 3 MiB free, threshold 4 MiB)'
    """
    changes = []
    if decision.rung != previous.rung:
        changes.append(f"rung {previous.rung} -> {decision.rung} ({units} units checkpointed)")
    if decision.split != previous.split:
        chunks = f"the batch in {decision.split} chunks" if decision.split > 1 else "the whole batch"
        changes.append(f"split {previous.split} -> {decision.split} ({chunks})")
    if decision.compression != previous.compression:
        changes.append(f"compression {previous.compression:.3f} -> {decision.compression:.3f}")
    return (
        f"step {step}: {', '.join(changes)} ({decision.reason}: "
        f"{decision.free / MIB:.0f} MiB free, threshold {decision.threshold / MIB:.0f} MiB)"
    )


class BaselineDrift:
    """The job's own baseline (what it holds between steps, at a measured step's start) over a
    run: its growth said once, when it exceeds ``large`` bytes (the ladder's ``min_free``: the
    headroom it keeps), with its rate. The first base seen is skipped (the run's first step
    allocates the optimizer's state within it).

    Example:
        >>> drift = BaselineDrift("Job")
        >>> [drift.update(step, base, large=100 * MIB) is not None for step, base in
        ...  [(1, 800 * MIB), (2, 900 * MIB), (5, 960 * MIB), (9, 1010 * MIB), (12, 1020 * MIB)]]
        [False, False, False, True, False]
        >>> print(drift.message)  # doctest: +ELLIPSIS
        Job: the job's own memory between steps grew by 110.0 MiB from step 2 to step 9 (15.71 MiB a step)...
    """

    def __init__(self, owner: str) -> None:
        self.owner = owner
        self.first: tuple[int, int] | None = None  # (step, bytes): the first base counted
        self.seen = 0
        self.message: str | None = None  # said once, then kept

    def update(self, step: int, base: int | None, large: float) -> str | None:
        """A check's base at ``step``; the message when the growth first exceeds ``large``."""
        if base is None or self.message is not None:
            return None
        self.seen += 1
        if self.seen == 1:
            return None
        if self.first is None:
            self.first = (step, base)
            return None
        growth = base - self.first[1]
        if growth <= large or step <= self.first[0]:
            return None
        rate = growth / (step - self.first[0])
        self.message = (
            f"{self.owner}: the job's own memory between steps grew by {growth / MIB:.1f} MiB from "
            f"step {self.first[0]} to step {step} ({rate / MIB:.2f} MiB a step), more than the "
            f"{large / MIB:.1f} MiB the ladder keeps free (a cache filling, an allocator growing). "
            "The ladder learns each setting from the step's increment above it, so the growth does "
            "not count against a rung; the free memory it takes is met like any shortfall (README, "
            '"The job\'s own drift")'
        )
        return self.message
