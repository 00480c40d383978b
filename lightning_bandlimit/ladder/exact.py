"""The exact points of the ladder over (rung, split), and what was measured on them.

The exact lever is a sequence of settings at the floor compression, fastest first
(:meth:`ExactPoints.exact_points`): rungs ``0 .. top`` on the whole batch (rung ``r``
checkpoints the model's first ``r`` stages), then the top rung with its batch run in each of the
micro-batch splits (ascending). Gradients are exact on every point; each costs step time. This
module keeps what was measured there and what follows from it:

* the peak per rung (a :class:`~lightning_bandlimit.ladder.memory_model.MemoryModel` keyed by
  rung) and per split on the top rung (:class:`~lightning_bandlimit.ladder.splits.SplitMemory`),
  each over the job's **baseline** (what it holds between steps; the peaks move with it, see
  :class:`~lightning_bandlimit.ladder.learned.LadderModel`), and the step time per rung and
  split (:meth:`ExactPoints.slowdown`);
* the bytes each stage keeps for backward (:meth:`ExactPoints.on_stages_measured`), which judge
  an idle rung (:meth:`ExactPoints.idle_from`) and hint which rung to try first;
* three readings of a point not measured yet, each used where its direction is safe: the
  conservative prediction (:meth:`ExactPoints.predict_rung`: freeing nothing over the rung
  below, what the ladder relies on), the hint (:meth:`ExactPoints.hinted`: which point to try
  first) and the bound going down (:meth:`ExactPoints._added`, :meth:`ExactPoints._added_to`:
  what un-checkpointing stages or fewer chunks may add at most).

:class:`~lightning_bandlimit.ladder.learned.LadderModel` adds the compression continuum and the
observations, and owns when the top rung or the splits change (and what that forgets). Plain
Python (no torch, no Lightning).
"""

from __future__ import annotations

from collections.abc import Sequence

from lightning_bandlimit.ladder.memory_model import MemoryModel
from lightning_bandlimit.ladder.setting import Setting
from lightning_bandlimit.ladder.splits import SplitMemory
from lightning_bandlimit.utils.validation import check_compression, check_int

__all__ = ["IDLE_FRACTION", "ExactPoints"]

# A rung is idle when it frees less than this fraction of the least its stage may free (a
# fraction of the stage's bytes, no unit): a stage checkpointed past where the step's peak lies
# frees next to nothing at the peak (the quickstart model's stages 3-4 after 1-2, measured by
# benchmarks/memory/ladder_memory.py); the fraction leaves room for the peak's own noise. A design
# choice, not fitted to a measurement.
IDLE_FRACTION = 0.25


class ExactPoints:
    """The exact points over (rung, split) and what was measured on them (see the module docstring).

    Args:
        rungs: exact rungs above rung 0 (the model's checkpointable stages).
        min_compression: the floor compression (the exact points run at it).

    Raises:
        ValueError: for a negative ``rungs`` or a ``min_compression`` outside ``[0, 1)``.
        TypeError: for a ``rungs`` that is not an int, or a ``min_compression`` not a real number.

    Example:
        >>> points = ExactPoints(rungs=2)
        >>> points.exact_points()[-1], points.predict_rung(1)  # nothing measured yet
        (Setting(rung=2, compression=0.0), None)
    """

    def __init__(self, rungs: int = 0, min_compression: float = 0.0) -> None:
        self.rungs = check_int("rungs", rungs, minimum=0)
        self.min_compression = check_compression(min_compression, "min_compression")
        self.top = self.rungs  # the highest rung still on the ladder (max_slowdown may lower it)
        self.rung_memory = MemoryModel(resolution=1.0)  # peak per rung, at the floor compression
        self.rung_seconds: dict[int, float] = {}  # step time per rung (moving average)
        self.stage_savings: list[float] | None = None  # bytes each stage frees when checkpointed
        self.stage_least: list[float] | None = None  # and the least it may free (the idle judgement)
        self.splits: tuple[int, ...] = ()  # the micro-batch splits above the top rung (none: no lever)
        self.split_memory = SplitMemory()  # peak and step time per split, on the top rung
        # what the job held at the start of the last measured step whose start was measured
        # (bytes; None: never measured): the learned peaks are those on this baseline
        self.baseline: float | None = None

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
            >>> model = ExactPoints(rungs=4)
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

    def exact_points(self) -> list[Setting]:
        """The exact settings in ladder order: rungs ``0 .. top`` (whole batch), then the top
        rung at each split.

        Example:
            >>> from lightning_bandlimit.ladder import LadderModel
            >>> model = LadderModel(rungs=1); model.on_splits_chosen([2])
            >>> points = model.exact_points(); len(points), points[-1]
            (3, Setting(rung=1, compression=0.0, split=2))
        """
        rungs = [Setting(r, self.min_compression) for r in range(self.top + 1)]
        return rungs + [Setting(self.top, self.min_compression, split=s) for s in self.splits]

    def measured(self, point: Setting) -> float | None:
        """The peak measured at the exact ``point`` (a rung, or a split on the top rung);
        ``None``: not yet."""
        if point.split == 1:
            return self.rung_memory.points.get(point.rung)
        return self.split_memory.points.get(point.split) if point.rung == self.top else None

    def predict_rung(self, rung: int) -> float | None:
        """Predicted peak on ``rung`` at the floor compression: measured there, else
        conservatively that of the highest measured rung below it (freeing nothing more);
        ``None`` if no rung at or below it was measured."""
        points = self.rung_memory.points
        if rung in points:
            return points[rung]
        below = [r for r in points if r < rung]
        return points[max(below)] if below else None

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

    def _saved(self, rung: int) -> float:
        return sum(self.stage_savings[:rung]) if self.stage_savings else 0.0

    def idle_from(self) -> int | None:
        """The lowest rung measured to free less than :data:`IDLE_FRACTION` of the least its stage
        may free, over the measured rung just below it (a jump over several rungs says nothing of each
        stage); ``None``: none. It and the rungs above it free nothing worth their recompute.

        Example:
            >>> from lightning_bandlimit.ladder import LadderModel
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

    def slowdown(self, rung: int, split: int = 1) -> float | None:
        """Measured step time on ``rung`` (at ``split``) over rung 0's; ``None`` until both were measured."""
        base = self.rung_seconds.get(0)
        time = self.rung_seconds.get(rung) if split == 1 else self.split_memory.seconds.get(split)
        return None if not base or time is None else time / base
