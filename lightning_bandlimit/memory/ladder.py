"""Exact levers first, lossy last: one controller over activation checkpointing and compression.

A job's memory levers form a ladder of settings, least lossy first:

* **exact rungs** ``0 .. rungs`` at the floor compression: rung 0 checkpoints nothing, rung
  ``r`` checkpoints the model's first ``r`` stages (highest resolution first). Gradients are
  exact on every rung; each costs a measured amount of step time (the recompute).
* **the compression continuum** above the floor (lossy), on the **lossy rung**: the top rung
  when the checkpointed blocks keep only their kept spectrum
  (:mod:`lightning_bandlimit.spectral_checkpoint`; :meth:`LadderController.set_continuum_on_top`),
  so that more compression also shrinks what the checkpointed blocks keep and the continuum
  goes on where the exact rungs stop; else rung 0, because a block checkpointed the ordinary
  way keeps its input at full size while a memory-lean band-limited block keeps only its kept
  spectrum (measured on the quickstart model: all blocks checkpointed at compression 0.5 kept
  more than none at 0.5), and the continuum starts where a compression on rung 0 is predicted
  to need less than the top rung.

The controller is plain Python (no Lightning, no torch), fed one
:class:`~lightning_bandlimit.memory.probes.MemoryReading` per check and the job's peak memory
at the setting it ran with, with the same thresholds, hysteresis and cooldown as
:class:`~lightning_bandlimit.memory.controller.CompressionController`:

* **Pressure** (free below ``min_free``): the least lossy setting predicted to free the missing
  bytes (plus the *surprise*: how much more the job measured at the setting it changed to than
  it had predicted there; memory other jobs took while it held is the deficit, never surprise;
  plus the *trend*: others' growth seen over each of the last two checks the job held its
  setting, expected once more, so a sustained ramp is met ahead and a single jump is not
  counted twice).
  A rung's memory is what the job measured on it at the step's peak; a rung not visited yet is
  predicted conservatively, as freeing nothing over the measured rung below it, wherever the
  ladder relies on a prediction (to stop climbing, to compress, to release). Which unvisited
  rung to try first is hinted by the bytes its stages keep for backward (measured once,
  :meth:`LadderController.set_stage_savings`): the least rung they say is enough, exact either
  way, else the top rung at once (exact, and the most any rung frees). Beyond the top rung the
  least compression its learned memory-versus-compression model predicts to fit, and only one
  predicted to need less than every smaller compression (a compression that costs memory is
  never picked); with no model yet, on the top rung one ``raise_step`` more, on rung 0
  ``max_compression`` (only a large compression is sure to free more than the top rung did),
  and after a raise measured not to lower memory ``max_compression`` at once (never a second
  step into the unknown while over budget), given back at the next release as far as the
  model then learned allows.
* **Hold** between ``min_free`` and ``release_free``.
* **Release** (``release_checks`` calm checks and a cooldown): the lossy part first (to the
  fastest exact rung predicted to keep ``release_free`` free, else to the least compression
  predicted to, else by ``lower_step``), then the exact rungs, to the lowest rung predicted to
  keep it free (else one rung), so a job with no pressure runs at plain speed.

``max_slowdown`` caps the time cost: a rung whose measured step time exceeds it (relative to
rung 0) and every rung above it leave the ladder; the continuum then starts below them. A rung
measured to free less than a quarter of what its stages keep for backward (the step's peak
lies elsewhere: on the quickstart model checkpointing stages 3-4 after 1-2 frees nothing at the
peak, at any compression) leaves the ladder the same way, with the rungs above it: it would
cost recompute time and free nothing. (Beside the climb's hint, the stages' saved bytes serve
only this judgement: the step's peak is not where they are kept.)
With ``rungs=0`` the ladder is the compression continuum alone.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from lightning_bandlimit.memory.memory_model import HOLD, LOWER, RAISE, MemoryModel, threshold_bytes
from lightning_bandlimit.memory.probes import MemoryReading
from lightning_bandlimit.utils.validation import check_compression, check_int, check_real

__all__ = ["LadderController", "LadderDecision", "Setting"]

_GRID = 0.01  # compressions searched when jumping with the memory model


@dataclass(frozen=True)
class Setting:
    """A point of the ladder: checkpointed stages (``rung``) and the compression."""

    rung: int
    compression: float


@dataclass(frozen=True)
class LadderDecision:
    """One check's outcome: the setting to apply and why (``hold|raise|lower|oom``)."""

    rung: int
    compression: float
    reason: str
    free: int
    threshold: int

    @property
    def setting(self) -> Setting:
        return Setting(self.rung, self.compression)


def _saved_value(value: tuple[Setting, float] | None) -> list[float] | None:
    return None if value is None else [value[0].rung, value[0].compression, value[1]]


def _setting_value(saved: list[float] | None) -> tuple[Setting, float] | None:
    return None if saved is None else (Setting(int(saved[0]), float(saved[1])), float(saved[2]))


class LadderController:
    """Maps memory readings to ladder settings (see the module docstring).

    Args:
        rungs: exact rungs above rung 0 (the model's checkpointable stages); ``0``: compression only.
        min_free: free memory to keep: bytes (``>= 1``) or a fraction of the total (``< 1``).
        release_free: free memory above which levers are given back (same unit, above
            ``min_free``). Default: ``min_free`` doubled.
        min_compression: the floor compression (the exact rungs run at it).
        max_compression: the highest compression; equal to ``min_compression``: no lossy part.
        raise_step: compression added per check under pressure when the model cannot say more.
        lower_step: compression removed per release while the model cannot predict.
        release_checks: consecutive checks above ``release_free`` before a release.
        cooldown_checks: checks after any change before a release.
        margin: extra fraction of the deficit to free.
        max_slowdown: the most step time a rung may cost relative to rung 0 (e.g. ``1.5``);
            ``None``: no cap.

    Raises:
        ValueError: for thresholds or bounds out of order, or non-positive steps and counts.
        TypeError: for a count that is not an int.

    Example:
        >>> from lightning_bandlimit.memory.probes import MemoryReading
        >>> ladder = LadderController(rungs=2, min_free=100, release_free=300)
        >>> ladder.observe(Setting(0, 0.0), 1000)
        >>> short = MemoryReading(total=2000, free=50, source="scripted")  # 50 bytes short (+10 %)
        >>> ladder.decide(short, Setting(0, 0.0))  # no rung visited yet: the top one, exact
        LadderDecision(rung=2, compression=0.0, reason='raise', free=50, threshold=100)
        >>> ladder.observe(Setting(2, 0.0), 600); ladder.observe(Setting(1, 0.0), 900)
        >>> ladder.decide(short, Setting(0, 0.0))  # rung 1 measured to free 100: enough
        LadderDecision(rung=1, compression=0.0, reason='raise', free=50, threshold=100)
    """

    def __init__(
        self,
        rungs: int = 0,
        min_free: float = 0.1,
        release_free: float | None = None,
        min_compression: float = 0.0,
        max_compression: float = 0.9,
        raise_step: float = 0.2,
        lower_step: float = 0.05,
        release_checks: int = 3,
        cooldown_checks: int = 2,
        margin: float = 0.1,
        max_slowdown: float | None = None,
    ) -> None:
        self.rungs = check_int("rungs", rungs, minimum=0)
        check_real("min_free", min_free, minimum=0, min_open=True)
        release_free = 2 * min_free if release_free is None else release_free
        check_real("release_free", release_free, minimum=0, min_open=True)
        if (min_free < 1) != (release_free < 1) or release_free <= min_free:
            raise ValueError(
                "release_free must be above min_free and in the same unit (both fractions < 1 or "
                f"both bytes), got min_free={min_free}, release_free={release_free}"
            )
        self.min_compression = check_compression(min_compression, "min_compression")
        self.max_compression = check_compression(max_compression, "max_compression")
        if self.max_compression < self.min_compression:
            raise ValueError(
                f"max_compression ({max_compression}) is below min_compression ({min_compression})"
            )
        self.raise_step = check_real("raise_step", raise_step, minimum=0, min_open=True)
        self.lower_step = check_real("lower_step", lower_step, minimum=0, min_open=True)
        self.release_checks = check_int("release_checks", release_checks, minimum=1)
        self.cooldown_checks = check_int("cooldown_checks", cooldown_checks, minimum=0)
        self.margin = check_real("margin", margin, minimum=0)
        if max_slowdown is not None:
            check_real("max_slowdown", max_slowdown, minimum=1)
        self.min_free, self.release_free, self.max_slowdown = min_free, release_free, max_slowdown
        self.top = self.rungs  # the highest rung still on the ladder (max_slowdown may lower it)
        self.rung_memory = MemoryModel(resolution=1.0)  # peak per rung, at the floor compression
        self.compression_memory = MemoryModel()  # peak per compression, on the lossy rung
        self.continuum_on_top = False
        self.rung_seconds: dict[int, float] = {}  # step time per rung (moving average)
        self.stage_savings: list[float] | None = None  # bytes each stage frees when checkpointed
        self.oom_floor = self.min_compression
        self._calm = 0
        self._since_change = cooldown_checks
        self._expected: tuple[Setting, float] | None = None  # a change's target and predicted peak
        self._last: tuple[Setting, float] | None = None  # the last check's setting and free bytes
        self._growth: list[float | None] = [None, None]  # others' growth over the last two checks
        self._held: list[float | None] = [None, None]  # the last two seen while the job held

    # -- what the job tells the controller -------------------------------------------------

    def set_stage_savings(self, savings: list[float]) -> None:
        """Bytes each stage frees when checkpointed (stage 1 first), measured once by the caller.

        One number per stage: the ladder gets one rung per stage. A number of stages other than
        :attr:`rungs` resets what was learned per rung (the model's units changed).

        Raises:
            ValueError: for a negative number.
        """
        if any(s < 0 for s in savings):
            raise ValueError(f"stage savings must be non-negative bytes, got {savings}")
        self.set_rungs(len(savings))
        self.stage_savings = [float(s) for s in savings]

    def set_rungs(self, rungs: int) -> None:
        """The number of stages, when what each frees is unknown (e.g. measured with all of them
        checkpointed after an out-of-memory error); resets what was learned per rung if it changed.

        Raises:
            ValueError: for a negative number.
        """
        check_int("rungs", rungs, minimum=0)
        if rungs != self.rungs:
            self.rungs = self.top = rungs
            self.rung_memory = MemoryModel(resolution=1.0)
            self.rung_seconds = {}
            self.stage_savings = None

    def set_continuum_on_top(self, on_top: bool) -> None:
        """Run the compression continuum on the top rung (``True``: the checkpointed blocks keep
        only their kept spectrum, so compression shrinks them too) or on rung 0 (the default).
        A change forgets the learned memory-versus-compression model (it was of the other rung)."""
        if not isinstance(on_top, bool):
            raise TypeError(f"on_top must be a bool, got {on_top!r}")
        if on_top != self.continuum_on_top:
            self.continuum_on_top = on_top
            self.compression_memory = MemoryModel()

    @property
    def lossy_rung(self) -> int:
        """The rung the compression continuum runs on."""
        return self.top if self.continuum_on_top else 0

    def observe(self, setting: Setting, peak_bytes: float) -> str | None:
        """The job's peak memory measured at ``setting``; returns a message when rungs leave the
        ladder for freeing nothing measured (see the module docstring)."""
        message = None
        if setting.compression <= self.min_compression:
            self.rung_memory.observe(setting.rung, peak_bytes)
            message = self._drop_idle_rungs(setting.rung)
        if setting.rung == self.lossy_rung:
            self.compression_memory.observe(setting.compression, peak_bytes)
        return message

    def _drop_idle_rungs(self, rung: int) -> str | None:
        """Judge each measured rung against the measured rung just below it (a jump over
        several rungs says nothing of each stage); the lowest idle one leaves, with those above."""
        points = self.rung_memory.points
        if self.stage_savings is None or rung > self.top:
            return None
        for upper in range(1, self.top + 1):
            lower = upper - 1
            if upper not in points or lower not in points:
                continue
            kept = self._saved(upper) - self._saved(lower)
            freed = points[lower] - points[upper]
            if kept <= 0 or freed >= 0.25 * kept:
                continue
            self._lower_top(lower)
            freed_text = f"freed {freed / 2**20:.1f} MiB" if freed > 0 else "freed nothing"
            return (
                f"rung {upper} {freed_text} at the step's peak over rung {lower}, for {kept / 2**20:.1f} "
                f"MiB its stage keeps for backward; the ladder's top rung is now {lower}"
            )
        return None

    def agree_top(self, top: int) -> None:
        """Take the top rung the ranks agreed on (the lowest of theirs): a lower one than this
        rank's is taken as if this rank had lowered it (the continuum moves down with it)."""
        check_int("top", top, minimum=0)
        if top < self.top:
            self._lower_top(top)

    def _lower_top(self, top: int) -> None:
        self.top = top
        if self.continuum_on_top:  # the continuum moves down with the top rung
            self.compression_memory = MemoryModel()
            if top in self.rung_memory.points:
                self.compression_memory.observe(self.min_compression, self.rung_memory.points[top])

    def observe_time(self, rung: int, seconds: float) -> str | None:
        """A step's time on ``rung`` at the floor compression; returns a message when the rung
        leaves the ladder for being slower than ``max_slowdown``."""
        old = self.rung_seconds.get(rung)
        self.rung_seconds[rung] = seconds if old is None else old + 0.3 * (seconds - old)
        slowdown = self.slowdown(rung)
        if self.max_slowdown is None or slowdown is None or rung == 0 or rung > self.top:
            return None
        if slowdown > self.max_slowdown:
            self._lower_top(rung - 1)
            return (
                f"rung {rung} costs {slowdown:.2f}x rung 0's step time (max_slowdown {self.max_slowdown}); "
                f"the ladder's top rung is now {self.top}"
            )
        return None

    def slowdown(self, rung: int) -> float | None:
        """Measured step time on ``rung`` over rung 0's; ``None`` until both were measured."""
        base, time = self.rung_seconds.get(0), self.rung_seconds.get(rung)
        return None if not base or time is None else time / base

    # -- predictions -----------------------------------------------------------------------

    def _saved(self, rung: int) -> float:
        return sum(self.stage_savings[:rung]) if self.stage_savings else 0.0

    def predict_rung(self, rung: int) -> float | None:
        """Predicted peak on ``rung`` at the floor compression: measured there, else
        conservatively that of the highest measured rung below it (freeing nothing more);
        ``None`` if no rung at or below it was measured."""
        points = self.rung_memory.points
        if rung in points:
            return points[rung]
        below = [r for r in points if r < rung]
        return points[max(below)] if below else None

    def predict(self, setting: Setting) -> float | None:
        """Predicted peak at ``setting``; ``None`` if unknown."""
        if setting.compression <= self.min_compression:
            predicted = self.predict_rung(setting.rung)
            if predicted is None and setting.rung == self.lossy_rung:  # the continuum's start
                predicted = self.compression_memory.predict(setting.compression)
            return predicted
        on_continuum = setting.rung == self.lossy_rung
        return self.compression_memory.predict(setting.compression) if on_continuum else None

    # -- decisions -------------------------------------------------------------------------

    def clamp(self, c: float) -> float:
        """``c`` within ``[min_compression, max_compression]``."""
        return min(self.max_compression, max(self.min_compression, round(c, 6)))

    def decide(self, reading: MemoryReading, current: Setting) -> LadderDecision:
        """The setting for the next steps, given a reading taken at ``current``."""
        decision = self._decide(reading, current)
        target = decision.setting
        predicted = None if target == current else self.predict(target)
        self._expected = None if predicted is None else (target, predicted)
        return decision

    def surprise(self, current: Setting) -> float:
        """How much more memory the job measured at ``current`` than it predicted there when it
        changed to it (``0`` after a hold, or before the measurement)."""
        if self._expected is None or self._expected[0] != current:
            return 0.0
        measured = self.predict(current)
        return 0.0 if measured is None else max(0.0, measured - self._expected[1])

    def _decide(self, reading: MemoryReading, current: Setting) -> LadderDecision:
        low = threshold_bytes(self.min_free, reading.total)
        high = threshold_bytes(self.release_free, reading.total)
        self._since_change += 1
        surprise = self.surprise(current)
        trend = self._trend(current, reading.free)
        if reading.free < low:
            self._calm = 0
            deficit = (low - reading.free + surprise + trend) * (1 + self.margin)
            # others still growing would take the job over budget by the next check if the
            # change freed nothing: no try of a rung or compression whose memory is unknown
            ramp = 0.0 if None in self._held else max(0.0, min(self._held))  # type: ignore[type-var]
            sure = ramp > 0 and reading.free < ramp
            return self._change(self._raise(current, deficit, sure), current, RAISE, reading.free, low)
        if current.rung > self.top:  # above a rung that left the ladder: the same memory, faster
            return self._change(Setting(self.top, current.compression), current, LOWER, reading.free, low)
        if reading.free < high:
            self._calm = 0
            return LadderDecision(current.rung, current.compression, HOLD, reading.free, low)
        self._calm += 1
        if self._calm < self.release_checks or self._since_change <= self.cooldown_checks:
            return LadderDecision(current.rung, current.compression, HOLD, reading.free, high)
        return self._change(self._release(current, reading.free - high), current, LOWER, reading.free, high)

    def _trend(self, current: Setting, free: float) -> float:
        """Others' growth expected by the next check: the smaller of their last two growths
        seen while the job held its setting (a sustained ramp goes on), so ``0`` after a single
        jump (a step: the co-tenant took what it takes) or a change of the job's own. The
        smaller of the last two held growths before any such change is kept as ``ramp``."""
        held = self._last is not None and self._last[0] == current
        growth = self._last[1] - free if held else None  # type: ignore[index]
        self._growth = [self._growth[1], growth]
        if growth is not None:
            self._held = [self._held[1], growth]
        self._last = (current, float(free))
        if None in self._growth:
            return 0.0
        return max(0.0, min(self._growth))  # type: ignore[type-var]

    def _raise(self, current: Setting, deficit: float, sure: bool = False) -> Setting:
        """The setting for a shortfall of ``deficit`` bytes at ``current``; ``sure``: the job
        would overdraw by the next check if the change freed nothing, so the exact lever is not
        tried whole on the chance that an unvisited rung frees enough (a hinted rung still is)."""
        now = self.predict(current)
        exact = current.compression <= self.min_compression
        no_lossy = self.max_compression <= self.min_compression
        safe_end = (
            Setting(self.top, self.min_compression)
            if no_lossy
            else Setting(self.lossy_rung, self.max_compression)
        )
        if exact and current.rung < self.top:
            measured = self.rung_memory.points
            if now is not None:
                for rung in range(current.rung + 1, self.top + 1):
                    freed = now - measured[rung] if rung in measured else self._hinted_saving(rung, now)
                    if freed is not None and freed >= deficit:
                        return Setting(rung, self.min_compression)
            if no_lossy or (not sure and (self.top not in measured or now is None)):
                # a rung not visited may fit (its saving is unknown), or nothing else is known,
                # or there is no lossy lever: the whole exact lever at once
                return Setting(self.top, self.min_compression)
        if no_lossy:
            return safe_end
        lossy = self.lossy_rung
        above = [
            c for c in self._grid(self.min_compression, self.max_compression)[1:] if c > current.compression
        ]
        fitting = None if now is None else self._least_compression(now - deficit, above)
        if fitting is not None:
            return Setting(lossy, fitting)
        if exact and self.top > 0 and not self.continuum_on_top:
            return Setting(0, self.max_compression)  # from the top rung to rung 0, nothing known
        if self._raise_did_not_lower(current):
            return safe_end  # not another step into the unknown
        return Setting(lossy, self.clamp(current.compression + self.raise_step))

    def _raise_did_not_lower(self, current: Setting) -> bool:
        """Whether ``current``'s compression was measured to need no less than a smaller one."""
        if current.rung != self.lossy_rung or current.compression <= self.min_compression:
            return False
        points = self.compression_memory.points
        key = min(points, key=lambda c: abs(c - current.compression), default=None)
        if key is None or abs(key - current.compression) > 1e-6:
            return False
        return any(c < key and m <= points[key] for c, m in points.items())

    def _hinted_saving(self, rung: int, now: float) -> float | None:
        """Which unvisited rung to try first: what its stages keep for backward over the
        highest measured rung below it (a hint for the climb, exact either way; never a
        prediction that the ladder relies on to stop climbing or to release)."""
        measured = self.rung_memory.points
        below = [r for r in measured if r < rung]
        if not below or self.stage_savings is None:
            return None
        lower = int(max(below))
        ratio = 1.0  # of its stages' saved bytes, what the last climb measured freed at the peak
        under = [r for r in measured if r < lower]
        if under:
            previous = int(max(under))
            kept = self._saved(lower) - self._saved(previous)
            if kept > 0:
                ratio = min(1.0, max(0.0, (measured[previous] - measured[lower]) / kept))
        return now - measured[lower] + ratio * (self._saved(rung) - self._saved(lower))

    def _least_compression(self, needs: float, candidates: Iterable[float]) -> float | None:
        """The first of ``candidates`` (on the lossy rung) predicted to need at most ``needs``
        and less than every smaller compression (from the floor up)."""
        wanted = set(candidates)
        lowest = None
        for c in self._grid(self.min_compression, self.max_compression):
            p = self.compression_memory.predict(c)
            if p is None:
                return None
            if lowest is not None and p >= lowest:
                continue  # needs no less than a smaller compression: never picked
            lowest = p
            if c in wanted and p <= needs:
                return c
        return None

    def _release(self, current: Setting, spare: float) -> Setting:
        now = self.predict(current)
        measured = self.rung_memory.points
        floor = max(self.min_compression, self.oom_floor)
        if current.compression > self.min_compression:
            if now is not None and self.oom_floor <= self.min_compression:
                for rung in range(self.top + 1):  # fastest measured exact rung first
                    if rung in measured and measured[rung] <= now + spare:
                        return Setting(rung, self.min_compression)
            if current.compression <= floor:
                return current
            # least compression whose extra memory fits the spare
            fitting = (
                None
                if now is None
                else self._least_compression(now + spare, self._grid(floor, current.compression))
            )
            target = max(current.compression - self.lower_step if fitting is None else fitting, floor)
            return Setting(self.lossy_rung, self.clamp(min(target, current.compression)))
        if current.rung == 0:
            return current
        for rung in range(current.rung):  # fastest measured rung first
            if now is not None and rung in measured and measured[rung] - now <= spare:
                return Setting(rung, current.compression)
        if now is not None and current.rung - 1 in measured:
            return current  # predicted not to fit: hold
        return Setting(current.rung - 1, current.compression)  # not visited yet: one rung, to learn it

    def _grid(self, low: float, high: float) -> list[float]:
        steps = int(round((high - low) / _GRID))
        return [self.clamp(low + i * _GRID) for i in range(steps + 1)]

    def notify_change(self) -> None:
        """Restart the cooldown after a change this controller did not decide (another rank's,
        an out-of-memory retry): its last prediction no longer holds."""
        self._since_change = 0
        self._calm = 0
        self._expected = None
        self._last, self._growth, self._held = None, [None, None], [None, None]

    def on_oom(self, current: Setting) -> Setting:
        """The setting to retry an out-of-memory step with: the top rung if below it, else more
        compression (which releases never go below again)."""
        self.notify_change()
        exact = current.compression <= self.min_compression
        if exact and current.rung < self.top:
            return Setting(self.top, current.compression)
        if self.max_compression <= self.min_compression:
            return Setting(self.top, current.compression)
        jump = exact and current.rung > 0 and not self.continuum_on_top  # top rung -> rung 0
        retry = self.clamp(self.max_compression if jump else current.compression + self.raise_step)
        self.oom_floor = max(self.oom_floor, retry)
        return Setting(self.lossy_rung, retry)

    def _change(
        self, target: Setting, current: Setting, reason: str, free: int, threshold: int
    ) -> LadderDecision:
        if target == current:
            return LadderDecision(current.rung, current.compression, HOLD, free, threshold)
        self._since_change = 0
        self._calm = 0
        return LadderDecision(target.rung, target.compression, reason, free, threshold)

    def state_dict(self) -> dict[str, Any]:
        return {
            "rungs": self.rungs,
            "top": self.top,
            "rung_memory": self.rung_memory.state_dict(),
            "compression_memory": self.compression_memory.state_dict(),
            "rung_seconds": [[r, s] for r, s in sorted(self.rung_seconds.items())],
            "stage_savings": self.stage_savings,
            "oom_floor": self.oom_floor,
            "continuum_on_top": self.continuum_on_top,
            "calm": self._calm,
            "since_change": self._since_change,
            "expected": _saved_value(self._expected),
            "last": _saved_value(self._last),
            "growth": list(self._growth),
            "held_growth": list(self._held),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a :meth:`state_dict` (or a :class:`CompressionController`'s). Before the stages
        are known (:meth:`set_stage_savings` not called yet) the saved number of rungs is taken;
        a ladder with another number keeps only what does not depend on them (the compression
        model, the out-of-memory floor)."""
        saved_rungs = int(state.get("rungs", self.rungs))
        if saved_rungs != self.rungs and self.rungs == 0 and self.stage_savings is None:
            self.rungs = self.top = saved_rungs  # stages not measured yet: the saved ones
        self.continuum_on_top = bool(state.get("continuum_on_top", False))
        # a CompressionController's state keeps its model under "model"
        self.compression_memory.load_state_dict(state.get("compression_memory", state.get("model", {})))
        self.oom_floor = float(state.get("oom_floor", self.min_compression))
        self._calm = int(state.get("calm", 0))
        self._since_change = int(state.get("since_change", self.cooldown_checks))
        # (an older "expected_free" was a free-memory figure, not a prediction of the job's: dropped)
        self._expected, self._last = (_setting_value(state.get(key)) for key in ("expected", "last"))
        growth = state.get("growth") or [None, None]
        self._growth = [None if g is None else float(g) for g in growth]
        held = state.get("held_growth") or [None, None]
        self._held = [None if g is None else float(g) for g in held]
        if saved_rungs != self.rungs:
            return
        self.top = min(int(state.get("top", self.rungs)), self.rungs)
        self.rung_memory.load_state_dict(state.get("rung_memory", {}))
        self.rung_seconds = {int(r): float(s) for r, s in state.get("rung_seconds", [])}
        savings = state.get("stage_savings")
        self.stage_savings = None if savings is None else [float(s) for s in savings]
