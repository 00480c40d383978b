"""What a ladder has learned of its job: the peak memory measured on each rung and at each
compression of the continuum, each rung's step time, the top rung still on the ladder, and the
predictions made from them (conservative where nothing was measured).

A setting's memory is what the setting changes: the step's increment, its peak less what the
job held at the step's start (its **baseline**: parameters, optimizer state, data caches),
where the measurement gives that start. The baseline is a separate term, allowed to grow (a
cache filling through the first epoch, an allocator growing): every learned peak is the
increment measured at its setting on the latest baseline, so a rung measured while the
baseline was lower is not judged against one measured after it grew (:meth:`LadderModel.observe`).

:class:`~lightning_bandlimit.ladder.controller.LadderController` decides from it; it is plain
Python (no torch, no Lightning).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence

from lightning_bandlimit.ladder.memory_model import MemoryModel
from lightning_bandlimit.ladder.setting import Setting
from lightning_bandlimit.ladder.splits import SplitMemory, check_splits
from lightning_bandlimit.utils.units import MIB
from lightning_bandlimit.utils.validation import check_compression, check_int, check_real

__all__ = ["IDLE_FRACTION", "TIME_SMOOTHING", "LadderModel"]

_GRID = 0.01  # compressions searched when jumping with the memory model
_JITTER_CHECKS = 8  # consecutive measurements at one setting the peak's noise is taken over
# A rung is idle when it frees less than this fraction of the least its stage may free (a
# fraction of the stage's bytes, no unit): a stage checkpointed past where the step's peak lies
# frees next to nothing at the peak (the quickstart model's stages 3-4 after 1-2, measured by
# benchmarks/ladder_memory.py); the fraction leaves room for the peak's own noise. A design
# choice, not fitted to a measurement.
IDLE_FRACTION = 0.25
# Weight of a new step time in a rung's exponential moving average of step seconds (no unit):
# a new rung's figure is within 3 % of a steady step time after 10 steps (0.7 ** 10).
TIME_SMOOTHING = 0.3


class LadderModel:
    """A ladder's measurements and predictions (see the module docstring).

    Args:
        rungs: exact rungs above rung 0 (the model's checkpointable stages).
        min_compression: the floor compression (the exact rungs run at it).
        max_compression: the highest compression; equal to ``min_compression``: no lossy lever.
        max_slowdown: the most step time a rung may cost relative to rung 0; ``None``: no cap.

    Raises:
        ValueError: for bounds out of order or a ``max_slowdown`` below 1.
        TypeError: for a count that is not an int.

    Example:
        >>> model = LadderModel(rungs=2)
        >>> model.observe(Setting(0, 0.0), 1000, base=400); model.observe(Setting(2, 0.0), 600, base=400)
        >>> model.predict(Setting(1, 0.0)), model.predict(Setting(2, 0.0))  # rung 1: as rung 0
        (1000, 600)
        >>> model.observe(Setting(2, 0.0), 650, base=450)  # the baseline grew by 50: every peak with it
        >>> model.predict(Setting(0, 0.0)), model.predict(Setting(2, 0.0)), model.baseline
        (1050.0, 650.0, 450.0)
    """

    def __init__(
        self,
        rungs: int = 0,
        min_compression: float = 0.0,
        max_compression: float = 0.9,
        max_slowdown: float | None = None,
    ) -> None:
        self.rungs = check_int("rungs", rungs, minimum=0)
        self.min_compression = check_compression(min_compression, "min_compression")
        self.max_compression = check_compression(max_compression, "max_compression")
        if self.max_compression < self.min_compression:
            raise ValueError(
                f"max_compression ({max_compression}) is below min_compression ({min_compression})"
            )
        if max_slowdown is not None:
            check_real("max_slowdown", max_slowdown, minimum=1)
        self.max_slowdown = max_slowdown
        self.top = self.rungs  # the highest rung still on the ladder (max_slowdown may lower it)
        self.rung_memory = MemoryModel(resolution=1.0)  # peak per rung, at the floor compression
        self.compression_memory = MemoryModel()  # peak per compression, on the lossy rung
        self.continuum_on_top = False
        self.rung_seconds: dict[int, float] = {}  # step time per rung (moving average)
        self.stage_savings: list[float] | None = None  # bytes each stage frees when checkpointed
        self.stage_least: list[float] | None = None  # and the least it may free (the idle judgement)
        self.observations = 0  # observations so far (in this process)
        self.last_observation: tuple[Setting, float] | None = None  # the last one, as measured
        # what the job held at the start of the last measured step whose start was measured
        # (bytes; None: never measured): the learned peaks are those on this baseline
        self.baseline: float | None = None
        self._last_increment: float | None = None  # the last observation's peak over its baseline
        # |change| of the peak between consecutive checks at one setting, the last few
        self.peak_jitter: deque[float] = deque(maxlen=_JITTER_CHECKS)
        self.splits: tuple[int, ...] = ()  # the micro-batch splits above the top rung (none: no lever)
        self.split_memory = SplitMemory()  # peak and step time per split, on the top rung

    def on_stages_measured(
        self,
        savings: Sequence[float] | None = None,
        least: Sequence[float] | None = None,
        *,
        rungs: int | None = None,
    ) -> None:
        """The stages were measured: bytes each frees when checkpointed (stage 1 first; one rung
        per stage), and the least each may free when ``savings`` is an upper figure (measured on
        samples, it counts the stages' inputs, which an earlier op may keep anyway): a rung is
        judged idle against ``least`` (default: ``savings``), never against an upper figure.
        ``savings=None``: only their number ``rungs`` is known (e.g. measured with every stage
        checkpointed after an out-of-memory error); what was known of each stage is kept when the
        number is the same. A number of stages other than :attr:`rungs` resets what was learned
        per rung (the model's units changed).

        Args:
            savings: bytes each stage frees, or ``None``.
            least: the least each stage may free (with ``savings``).
            rungs: the number of stages (default: ``len(savings)``).

        Raises:
            ValueError: for a negative number, ``least`` of another length or above ``savings``,
                or ``rungs`` other than ``len(savings)``.
            TypeError: for ``rungs`` that is not an int.

        Example:
            >>> model = LadderModel(rungs=4)
            >>> model.on_stages_measured(rungs=2); model.rungs, model.stage_savings
            (2, None)
            >>> model.on_stages_measured([300.0, 100.0]); model.stage_least
            [300.0, 100.0]
        """
        if savings is None:
            rungs = check_int("rungs", rungs, minimum=0)
            if rungs != self.rungs:
                self.rungs = self.top = rungs
                self.rung_memory = MemoryModel(resolution=1.0)
                self.rung_seconds = {}
                self.stage_savings = self.stage_least = None
            return
        if rungs is not None and rungs != len(savings):
            raise ValueError(f"rungs ({rungs}) must be the number of stage savings, got {list(savings)}")
        if any(s < 0 for s in savings) or (least is not None and any(s < 0 for s in least)):
            raise ValueError(
                f"stage savings must be non-negative bytes, got {list(savings)} and least {least}"
            )
        if least is not None and (len(least) != len(savings) or any(a > b for a, b in zip(least, savings))):
            raise ValueError(
                f"least stage savings must be at most the savings, stage by stage, got {least} for {savings}"
            )
        self.on_stages_measured(rungs=len(savings))
        self.stage_savings = [float(s) for s in savings]
        self.stage_least = [float(s) for s in (savings if least is None else least)]

    def on_continuum_chosen(self, on_top: bool) -> None:
        """The caller chose where the compression continuum runs: on the top rung (``True``: the
        checkpointed blocks keep only their kept spectrum, so compression shrinks them too) or on
        rung 0 (the default). A change forgets the learned memory-versus-compression model (it
        was of the other rung).

        Raises:
            TypeError: for ``on_top`` that is not a bool.
        """
        if not isinstance(on_top, bool):
            raise TypeError(f"on_top must be a bool, got {on_top!r}")
        if on_top != self.continuum_on_top:
            self.continuum_on_top = on_top
            self.compression_memory = MemoryModel()

    def on_splits_chosen(self, splits: Sequence[int]) -> None:
        """The micro-batch splits the ladder may use above its top rung (ascending; tried exact,
        or ``()``: none). A change forgets what was measured of the splits and, since the
        continuum runs at the largest split, the memory-versus-compression model.

        Raises:
            TypeError: for a split that is not an int.
            ValueError: for a split below 2.

        Example:
            >>> model = LadderModel(rungs=2)
            >>> model.on_splits_chosen([4, 2]); model.splits, model.lossy_split
            ((2, 4), 4)
        """
        splits = check_splits(splits)
        if splits != self.splits:
            self.splits = splits
            self.split_memory.forget()
            self.compression_memory = MemoryModel()

    @property
    def lossy_rung(self) -> int:
        """The rung the compression continuum runs on."""
        return self.top if self.continuum_on_top else 0

    @property
    def lossy_split(self) -> int:
        """The split the compression continuum runs at: the largest (the spectral cutoff comes
        after every split), ``1`` without splits."""
        return self.splits[-1] if self.splits else 1

    def exact_points(self) -> list[Setting]:
        """The exact settings in ladder order: rungs ``0 .. top`` (whole batch), then the top
        rung at each split.

        Example:
            >>> model = LadderModel(rungs=1); model.on_splits_chosen([2])
            >>> points = model.exact_points(); len(points), points[-1]
            (3, Setting(rung=1, compression=0.0, split=2))
        """
        rungs = [Setting(r, self.min_compression) for r in range(self.top + 1)]
        return rungs + [Setting(self.top, self.min_compression, split=s) for s in self.splits]

    def observe(self, setting: Setting, peak_bytes: float, base: float | None = None) -> str | None:
        """The job's peak memory measured at ``setting`` (``base``: what the job held at the
        step's start, when measured); returns a message when rungs leave the ladder for freeing
        nothing measured (see the module docstring).

        A measured ``base`` other than :attr:`baseline` moves every learned peak with it
        (:meth:`_rebase`): what a setting needs is its increment over the baseline, which the
        job's own drift does not move, so settings measured at different times compare by what
        they change, and the idle judgement with them."""
        message = None
        previous = self.last_observation
        again = previous is not None and previous[0] == setting
        # the run's first step allocates the optimizer's state (and lazily made buffers) within
        # it: its peak falls short of a step's by that, so the next one at the same setting
        # takes its place, and their difference is not the peak's noise
        replace = again and self.observations == 1
        self.observations += 1
        increment = None
        if base is not None:
            self._rebase(float(base))
            increment = float(peak_bytes) - float(base)
        if again and not replace:
            if increment is not None and self._last_increment is not None:
                self.peak_jitter.append(abs(increment - self._last_increment))
            else:
                self.peak_jitter.append(abs(float(peak_bytes) - previous[1]))  # type: ignore[index]
        self.last_observation = (setting, float(peak_bytes))
        self._last_increment = increment
        if setting.compression <= self.min_compression and setting.split == 1:
            self.rung_memory.observe(setting.rung, peak_bytes, replace=replace)
            message = self._drop_idle_rungs(setting.rung)
        elif setting.compression <= self.min_compression and setting.rung == self.top:
            self.split_memory.observe(setting.split, peak_bytes, replace=replace)
        if setting.rung == self.lossy_rung and setting.split == self.lossy_split:
            self.compression_memory.observe(setting.compression, peak_bytes, replace=replace)
        return message

    def _rebase(self, base: float) -> None:
        """The job holds ``base`` bytes between steps now: every learned peak moves by the change."""
        if self.baseline is not None and base != self.baseline:
            self._shift(base - self.baseline)
        self.baseline = base

    def _shift(self, delta: float) -> None:
        self.rung_memory.shift(delta)
        self.split_memory.shift(delta)
        self.compression_memory.shift(delta)

    @property
    def peak_noise(self) -> float:
        """How much the job's peak moved between consecutive checks at one setting, at most, over
        the last few such checks (``0`` until two were measured; on a GPU's caching allocator
        usually ``0``, on a host's resident set about a MiB)."""
        return max(self.peak_jitter, default=0.0)

    def _drop_idle_rungs(self, rung: int) -> str | None:
        """The lowest idle rung (:meth:`idle_from`) leaves the ladder, with those above."""
        if self.stage_least is None or rung > self.top:
            return None
        upper = self.idle_from()
        if upper is None or upper > self.top:
            return None
        lower = upper - 1
        kept = self.stage_least[lower]
        freed = self.rung_memory.points[lower] - self.rung_memory.points[upper]
        self._lower_top(lower)
        freed_text = f"freed {freed / MIB:.1f} MiB" if freed > 0 else "freed nothing"
        return (
            f"rung {upper} {freed_text} at the step's peak over rung {lower}, for {kept / MIB:.1f} "
            f"MiB its stage keeps for backward; the ladder's top rung is now {lower}"
        )

    def idle_from(self) -> int | None:
        """The lowest rung measured to free less than :data:`IDLE_FRACTION` of the least its stage
        may free, over the measured rung just below it (a jump over several rungs says nothing of each
        stage); ``None``: none. It and the rungs above it free nothing worth their recompute.

        Example:
            >>> model = LadderModel(rungs=3)
            >>> model.on_stages_measured([400.0, 200.0, 100.0])
            >>> for rung, peak in [(0, 1000), (1, 620), (2, 600)]:
            ...     _ = model.observe(Setting(rung, 0.0), peak)
            >>> model.idle_from(), model.top  # rung 2 freed 20 of stage 2's 200
            (2, 1)
        """
        points = self.rung_memory.points
        if self.stage_least is None:
            return None
        for upper in range(1, self.rungs + 1):
            lower = upper - 1
            if upper not in points or lower not in points:
                continue
            kept = self.stage_least[lower]
            if kept > 0 and points[lower] - points[upper] < IDLE_FRACTION * kept:
                return upper
        return None

    def on_ranks_agreed(self, top: int, continuum_on_top: bool, splits: int | None = None) -> None:
        """The ranks agreed on the top rung (the lowest of theirs), on where the continuum runs
        (on the top rung only if on every rank) and on how many splits the ladder has (the
        fewest of any rank's; ``None``: not agreed): a lower top than this rank's is taken as if
        this rank had lowered it (the continuum moves down with it), fewer splits as if this
        rank had only those.

        Raises:
            ValueError: for a negative ``top``.
            TypeError: for a ``continuum_on_top`` that is not a bool.
        """
        check_int("top", top, minimum=0)
        if top < self.top:
            self._lower_top(top)
        self.on_continuum_chosen(continuum_on_top)
        if splits is not None and check_int("splits", splits, minimum=0) < len(self.splits):
            self.on_splits_chosen(self.splits[:splits])

    def _lower_top(self, top: int) -> None:
        self.top = top
        self.split_memory.forget()  # the splits run on the top rung: measured on another
        if self.continuum_on_top:  # the continuum moves down with the top rung
            self.compression_memory = MemoryModel()
            if top in self.rung_memory.points and not self.splits:
                self.compression_memory.observe(self.min_compression, self.rung_memory.points[top])

    def observe_time(self, rung: int, seconds: float, split: int = 1) -> str | None:
        """A step's time on ``rung`` at the floor compression (``split``: the chunks its batch ran
        in, on the top rung); returns a message when the rung leaves the ladder for being slower
        than ``max_slowdown`` (a split is timed, never dropped: it is the last exact lever)."""
        if split != 1:
            if rung == self.top:
                self.split_memory.observe_time(split, seconds, TIME_SMOOTHING)
            return None
        old = self.rung_seconds.get(rung)
        self.rung_seconds[rung] = seconds if old is None else old + TIME_SMOOTHING * (seconds - old)
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

    def slowdown(self, rung: int, split: int = 1) -> float | None:
        """Measured step time on ``rung`` (at ``split``) over rung 0's; ``None`` until both were measured."""
        base = self.rung_seconds.get(0)
        time = self.rung_seconds.get(rung) if split == 1 else self.split_memory.seconds.get(split)
        return None if not base or time is None else time / base

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
        on_continuum = setting.rung == self.lossy_rung and setting.split == self.lossy_split
        if setting.compression <= self.min_compression:
            if setting.split == 1:
                predicted = self.predict_rung(setting.rung)
            elif setting.rung == self.top:
                predicted = self.split_memory.predict(setting.split, self.rung_memory.points.get(self.top))
            else:
                predicted = None
            if predicted is None and on_continuum:  # the continuum's start
                predicted = self.compression_memory.predict(setting.compression)
            return predicted
        return self.compression_memory.predict(setting.compression) if on_continuum else None

    def hinted(self, setting: Setting, peak: float) -> float | None:
        """Which exact point not measured yet to try first: its hinted peak (a rung: its stages'
        saved bytes, :meth:`_hinted_saving`; a split: :meth:`SplitMemory.hint`), never a
        prediction the ladder relies on; measured points as measured."""
        if setting.split == 1:
            if setting.rung in self.rung_memory.points:
                return self.rung_memory.points[setting.rung]
            saving = self._hinted_saving(setting.rung, peak)
            return None if saving is None else peak - saving
        # the top rung measured, else (conservatively) the highest measured rung below it
        return self.split_memory.hint(setting.split, self.predict_rung(self.top), self.baseline)

    def clamp(self, c: float) -> float:
        """``c`` within ``[min_compression, max_compression]``."""
        return min(self.max_compression, max(self.min_compression, round(c, 6)))

    @property
    def lossy(self) -> bool:
        """Whether the ladder has a lossy lever (``max_compression`` above ``min_compression``)."""
        return self.max_compression > self.min_compression

    def measured(self, point: Setting) -> float | None:
        """The peak measured at the exact ``point`` (a rung, or a split on the top rung);
        ``None``: not yet."""
        if point.split == 1:
            return self.rung_memory.points.get(point.rung)
        return self.split_memory.points.get(point.split) if point.rung == self.top else None

    def _added_to(self, point: Setting, current: Setting, peak: float) -> float:
        """Memory going down from the split ``current`` (at ``peak``) to ``point`` adds: measured
        there, else bounded (fewer chunks, then the stages un-checkpointed)."""
        if (at := self.measured(point)) is not None:
            return at - peak
        if point.split > 1:
            return self.split_memory.bound(point.split, current.split, peak, self.baseline) - peak
        whole = self.measured(Setting(self.top, self.min_compression))
        if whole is None:
            whole = self.split_memory.bound(1, current.split, peak, self.baseline)
        further = 0.0 if point.rung == self.top else self._added(point.rung, self.top, whole)
        return whole - peak + further

    def _added(self, rung: int, current: int, peak: float) -> float:
        """Memory going down from rung ``current`` (at ``peak``) to ``rung`` adds: measured there,
        else at most what the stages between keep for backward (the most checkpointing them
        frees); ``inf`` when neither is known."""
        measured = self.rung_memory.points
        if rung in measured:
            return measured[rung] - peak
        if self.stage_savings is None:
            return float("inf")
        return self._saved(current) - self._saved(rung)

    def _hinted_saving(self, rung: int, peak: float) -> float | None:
        """Which unvisited rung to try first: what its stages keep for backward over the
        highest measured rung below it, the ``k``-th stage up discounted by ``ratio ** k``
        (``ratio``: what the last climb freed at the peak of its stage's bytes). A hint for the
        climb, exact either way; never a prediction the ladder relies on to stop climbing or to
        release."""
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
        # diminishing returns: each stage further up frees that fraction of what the one below
        # it was hinted to (the step's peak moves away from the stages as more are checkpointed)
        stages = self.stage_savings[lower:rung]
        return peak - measured[lower] + sum(ratio ** (k + 1) * kept for k, kept in enumerate(stages))

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

    def _grid(self, low: float, high: float) -> list[float]:
        steps = int(round((high - low) / _GRID))
        return [self.clamp(low + i * _GRID) for i in range(steps + 1)]
