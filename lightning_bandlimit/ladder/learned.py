"""What a ladder has learned of its job: the peak memory measured on each exact point (each rung,
each split on the top rung: :mod:`~lightning_bandlimit.ladder.exact`) and at each compression of
the continuum, each rung's and split's step time, the top rung still on the ladder, and the
predictions made from them (conservative where nothing was measured).

A setting's memory is what the setting changes: the step's increment, its peak less what the
job held at the step's start (its **baseline**: parameters, optimizer state, data caches),
where the measurement gives that start. The baseline is a separate term, allowed to grow (a
cache filling through the first epoch, an allocator growing): every learned peak is the
increment measured at its setting on the latest baseline, so a rung measured while the
baseline was lower is not judged against one measured after it grew (:meth:`LadderModel.observe`).

What was measured holds where it was measured: the splits' memory on the top rung at the splits
offered, the compression memory on the lossy rung at the largest split. One rule forgets it
(:meth:`LadderModel._reshape`) when the top rung, where the continuum runs or the splits change:
a rung leaving the ladder (idle or slow), the continuum chosen, the splits chosen, the ranks
agreeing.

:class:`~lightning_bandlimit.ladder.controller.LadderController` decides from it; it is plain
Python (no torch, no Lightning).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence

from lightning_bandlimit.ladder.exact import ExactPoints
from lightning_bandlimit.ladder.memory_model import MemoryModel
from lightning_bandlimit.ladder.setting import Setting
from lightning_bandlimit.ladder.splits import check_splits
from lightning_bandlimit.utils.units import MIB
from lightning_bandlimit.utils.validation import check_compression, check_int, check_real

__all__ = ["TIME_SMOOTHING", "LadderModel"]

_GRID = 0.01  # compressions searched when jumping with the memory model
_JITTER_CHECKS = 8  # consecutive measurements at one setting the peak's noise is taken over
# Weight of a new step time in a rung's exponential moving average of step seconds (no unit):
# a new rung's figure is within 3 % of a steady step time after 10 steps (0.7 ** 10).
TIME_SMOOTHING = 0.3


class LadderModel(ExactPoints):
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
        super().__init__(rungs, min_compression)
        self.max_compression = check_compression(max_compression, "max_compression")
        if self.max_compression < self.min_compression:
            raise ValueError(
                f"max_compression ({max_compression}) is below min_compression ({min_compression})"
            )
        if max_slowdown is not None:
            check_real("max_slowdown", max_slowdown, minimum=1)
        self.max_slowdown = max_slowdown
        self.compression_memory = MemoryModel()  # peak per compression, on the lossy rung
        self.continuum_on_top = False
        self.observations = 0  # observations so far (in this process)
        self.last_observation: tuple[Setting, float] | None = None  # the last one, as measured
        self._last_increment: float | None = None  # the last observation's peak over its baseline
        # |change| of the peak between consecutive checks at one setting, the last few
        self.peak_jitter: deque[float] = deque(maxlen=_JITTER_CHECKS)

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
        self._reshape(continuum_on_top=on_top)

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
        self._reshape(splits=check_splits(splits))

    @property
    def lossy_rung(self) -> int:
        """The rung the compression continuum runs on."""
        return self.top if self.continuum_on_top else 0

    @property
    def lossy_split(self) -> int:
        """The split the compression continuum runs at: the largest (the spectral cutoff comes
        after every split), ``1`` without splits."""
        return self.splits[-1] if self.splits else 1

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
        self._reshape(top=top)
        # the continuum moved down with the top rung: it starts where the new top was measured
        if self.continuum_on_top and top in self.rung_memory.points and not self.splits:
            self.compression_memory.observe(self.min_compression, self.rung_memory.points[top])

    def _reshape(
        self,
        *,
        top: int | None = None,
        continuum_on_top: bool | None = None,
        splits: tuple[int, ...] | None = None,
    ) -> None:
        """The one rule of forgetting: the ladder's top rung, where its continuum runs or its
        splits change (each given, the rest kept), and what was measured where the change moved
        no longer holds. The splits' memory was measured on the top rung at the splits offered;
        the compression memory on the lossy rung (:attr:`lossy_rung`: the top rung when the
        continuum runs there, else rung 0) at the largest split, where the continuum was chosen to
        run. A change of the stages' number (:meth:`on_stages_measured`) resets the rungs' memory
        alone."""
        split_at = (self.top, self.splits)
        compression_at = (self.continuum_on_top, self.lossy_rung, self.splits)
        if top is not None:
            self.top = top
        if continuum_on_top is not None:
            self.continuum_on_top = continuum_on_top
        if splits is not None:
            self.splits = splits
        if (self.top, self.splits) != split_at:
            self.split_memory.forget()
        if (self.continuum_on_top, self.lossy_rung, self.splits) != compression_at:
            self.compression_memory = MemoryModel()

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

    def clamp(self, c: float) -> float:
        """``c`` within ``[min_compression, max_compression]``."""
        return min(self.max_compression, max(self.min_compression, round(c, 6)))

    @property
    def lossy(self) -> bool:
        """Whether the ladder has a lossy lever (``max_compression`` above ``min_compression``)."""
        return self.max_compression > self.min_compression

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
