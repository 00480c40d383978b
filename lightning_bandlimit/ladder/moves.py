"""Where a move of the ladder goes: up under pressure or after an out-of-memory error, down on a
release, and room made for memory not measured yet.

:class:`LadderMoves` picks the target setting; when to move (thresholds, hysteresis, the
cooldown, the surprise, others' trend, the peak's noise) is the check's,
:class:`~lightning_bandlimit.ladder.controller.LadderController`, whose module docstring gives the
policy. The moves walk the exact points in ladder order
(:meth:`~lightning_bandlimit.ladder.exact.ExactPoints.exact_points`:
rungs ``0 .. top`` on the whole batch, then the top rung at each micro-batch split), then the
compression continuum on the lossy rung at the largest split:

* **up** (:meth:`LadderMoves._escalate`, the one escalation path; :meth:`LadderMoves._retry_after_oom`
  when the shortfall is unknown): the least exact point measured, else hinted, to free the
  shortfall; else the whole exact lever at once (the top rung, then the largest split) where a
  point not visited may fit; past the exact points the least compression the learned model
  predicts to fit, else a step (``raise_step``) or the most compression where nothing is known;
* **down** (:meth:`LadderMoves._release`): the lossy part first (to the fastest exact point
  measured to fit, else the least compression predicted to, else by ``lower_step``), then the splits
  (:meth:`LadderMoves._release_split`: fewer chunks, bounded where not measured), then the rungs
  (measured, else bounded by the stages' saved bytes), never below the out-of-memory floor;
* **room** (:meth:`LadderMoves.make_room`): the least exact point above the current one
  predicted to free a deficit, else the next one not measured yet; never a compression.

Plain Python (no torch, no Lightning).
"""

from __future__ import annotations

from dataclasses import replace

from lightning_bandlimit.ladder.learned import LadderModel
from lightning_bandlimit.ladder.setting import Setting

__all__ = ["LadderMoves"]


class LadderMoves(LadderModel):
    """The target settings of the ladder's moves (see the module docstring), from what the
    :class:`~lightning_bandlimit.ladder.learned.LadderModel` learned;
    :class:`~lightning_bandlimit.ladder.controller.LadderController` sets the steps and the floor
    below and decides when to move.
    """

    raise_step: float  # compression added under pressure when the model cannot say more
    lower_step: float  # compression removed per release while the model cannot predict
    oom_floor: float  # the least compression a release goes back to (after an out-of-memory error)

    @property
    def _safe_end(self) -> Setting:
        """The setting that needs the least memory: the most compression, else the top rung."""
        if self.lossy:
            return Setting(self.lossy_rung, self.max_compression, split=self.lossy_split)
        return Setting(self.top, self.min_compression, split=self.lossy_split)

    def _escalate(self, current: Setting, deficit: float, sure: bool) -> Setting:
        """The setting for a shortfall of ``deficit`` bytes at ``current``. ``sure``: the job would
        overdraw by the next check if the change freed nothing: no unvisited point tried unhinted."""
        if current.compression <= self.min_compression and current.rung > self.top:
            current = replace(current, rung=self.top)  # above rungs that left the ladder (idle, slow)
        peak = self.predict(current)
        points = self.exact_points()
        if current in points and current != points[-1]:  # an exact point, a higher one left
            if peak is not None and (point := self._least_point_freeing(current, peak, deficit)) is not None:
                return point
            # a point not visited may fit (its saving is unknown), or nothing else is known, or
            # no lever is left above: the whole exact lever at once (checkpointing, then splits)
            unknown_top = self.top not in self.rung_memory.points or peak is None
            below_top = current.split == 1 and current.rung < self.top
            if below_top and ((not self.lossy and not self.splits) or (not sure and unknown_top)):
                return Setting(self.top, self.min_compression)
            unknown_split = self.lossy_split not in self.split_memory.points or peak is None
            if self.splits and (not self.lossy or (not sure and unknown_split)):
                return Setting(self.top, self.min_compression, split=self.lossy_split)
        if not self.lossy:
            return self._safe_end
        if peak is not None:
            above = [
                c
                for c in self._grid(self.min_compression, self.max_compression)[1:]
                if c > current.compression
            ]
            if (fitting := self._least_compression(peak - deficit, above)) is not None:
                return Setting(self.lossy_rung, fitting, split=self.lossy_split)
            if self.compression_memory.predict(self.max_compression) is not None:
                return self._safe_end  # the model predicts no compression frees enough: the most there is
        return self._compress_unknown(current, leaves_rung=self.top > 0 or bool(self.splits))

    def _retry_after_oom(self, current: Setting) -> Setting:
        """The setting to retry a step that ran out of memory at ``current`` (the shortfall
        unknown): the top rung if below it, else more compression (from any rung)."""
        if current.compression <= self.min_compression:
            if current.split == 1 and current.rung < self.top:
                return Setting(self.top, self.min_compression)
            if current.split < self.lossy_split:  # on the top rung: the most exact lever at once
                return Setting(self.top, self.min_compression, split=self.lossy_split)
        if not self.lossy:
            return self._safe_end
        leaves = self.top > 0 or current.rung > 0 or bool(self.splits)
        return self._compress_unknown(current, leaves_rung=leaves)

    def _compress_unknown(self, current: Setting, leaves_rung: bool) -> Setting:
        """More compression where the memory model cannot say how much is enough."""
        exact = current.compression <= self.min_compression
        if exact and leaves_rung and not self.continuum_on_top:
            # past the exact rungs to the continuum on rung 0, nothing known of it: only a large
            # compression is sure to free more than the checkpointed rung did
            return Setting(0, self.max_compression, split=self.lossy_split)
        if self._raise_did_not_lower(current):
            return self._safe_end  # not another step into the unknown
        raised = self.clamp(current.compression + self.raise_step)
        return Setting(self.lossy_rung, raised, split=self.lossy_split)

    def _raise_did_not_lower(self, current: Setting) -> bool:
        """Whether ``current``'s compression was measured to need no less than a smaller one."""
        on_continuum = current.rung == self.lossy_rung and current.split == self.lossy_split
        if not on_continuum or current.compression <= self.min_compression:
            return False
        points = self.compression_memory.points
        key = min(points, key=lambda c: abs(c - current.compression), default=None)
        if key is None or abs(key - current.compression) > 1e-6:
            return False
        return any(c < key and m <= points[key] for c, m in points.items())

    def _release(self, current: Setting, spare: float) -> Setting:
        peak = self.predict(current)
        measured = self.rung_memory.points
        floor = max(self.min_compression, self.oom_floor)
        if current.compression > self.min_compression:
            if peak is not None and self.oom_floor <= self.min_compression:
                for point in self.exact_points():  # fastest measured exact point first
                    at = self.measured(point)
                    if at is not None and at <= peak + spare:
                        return point
            if current.compression <= floor:
                return current
            # least compression whose extra memory fits the spare
            fitting = (
                None
                if peak is None
                else self._least_compression(peak + spare, self._grid(floor, current.compression))
            )
            target = max(current.compression - self.lower_step if fitting is None else fitting, floor)
            lowered = self.clamp(min(target, current.compression))
            return Setting(self.lossy_rung, lowered, split=self.lossy_split)
        if current.split > 1:
            return self._release_split(current, peak, spare)
        if current.rung == 0:
            return current
        for rung in range(current.rung):  # fastest rung first, measured or bounded
            if peak is not None and self._added(rung, current.rung, peak) <= spare:
                return Setting(rung, current.compression)
        if peak is not None and current.rung - 1 in measured:
            return current  # predicted not to fit: hold
        return Setting(current.rung - 1, current.compression)  # not visited yet: one rung, to learn it

    def _release_split(self, current: Setting, peak: float | None, spare: float) -> Setting:
        """Down from a split (on the top rung): to the fastest exact point with fewer chunks
        whose memory (measured, else bounded: a chunk ``m`` times larger keeps at most ``m``
        times the increment) fits the spare; else one split down, to learn it, unless measured
        not to fit."""
        lower = [p for p in self.exact_points() if p.split < current.split]  # fastest first
        if not lower:
            return replace(current, split=1)
        if peak is not None:
            for point in lower:
                if self._added_to(point, current, peak) <= spare:
                    return point
        below = lower[-1]  # the next smaller split, or the top rung's whole batch
        return current if peak is not None and self.measured(below) is not None else below

    def make_room(self, current: Setting, deficit: float) -> Setting:
        """The least exact rung above ``current`` predicted (measured, else hinted) to free
        ``deficit`` bytes; else the next rung not measured yet, to be measured before the next
        move (room for memory not measured yet, such as another job's arrival, is not urgent:
        the newcomer waits, and the rungs learned on the way, the idle ones among them, serve
        this job and a later run of its model); else the top rung. Never a compression
        (``current`` when no exact rung is left).

        Example:
            >>> from lightning_bandlimit.ladder import LadderController
            >>> ladder = LadderController(rungs=3, min_free=100)
            >>> ladder.on_stages_measured([300.0, 100.0, 50.0]); ladder.observe(Setting(0, 0.0), 1000)
            >>> ladder.make_room(Setting(0, 0.0), 200.0)  # rung 1's stage keeps 300: hinted enough
            Setting(rung=1, compression=0.0)
            >>> ladder.make_room(Setting(0, 0.0), 5000.0)  # none is: one rung, measured first
            Setting(rung=1, compression=0.0)
            >>> ladder.observe(Setting(1, 0.0), 700); ladder.make_room(Setting(1, 0.0), 5000.0)
            Setting(rung=2, compression=0.0)
        """
        points = self.exact_points()
        if current not in points or current == points[-1]:
            return current
        peak = self.predict(current)
        if peak is None:
            return Setting(self.top, self.min_compression)
        if (point := self._least_point_freeing(current, peak, deficit)) is not None:
            return point
        above = points[points.index(current) + 1 :]
        unvisited = [p for p in above if self.measured(p) is None]
        return unvisited[0] if unvisited else points[-1]

    def _least_point_freeing(self, current: Setting, peak: float, deficit: float) -> Setting | None:
        """The least exact point above ``current`` (at ``peak``) measured, else hinted, to free
        ``deficit``."""
        points = self.exact_points()
        for point in points[points.index(current) + 1 :]:
            hinted = self.hinted(point, peak)
            if hinted is not None and peak - hinted >= deficit:
                return point
        return None
