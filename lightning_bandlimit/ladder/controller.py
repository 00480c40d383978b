"""Exact levers first, lossy last: one controller over activation checkpointing, micro-batch
splits and compression.

A job's memory levers form a ladder of settings, least lossy first:

* **exact rungs** ``0 .. rungs`` at the floor compression: rung 0 checkpoints nothing, rung
  ``r`` checkpoints the model's first ``r`` stages (highest resolution first). Gradients are
  exact on every rung; each costs a measured amount of step time (the recompute).
* **micro-batch splits** on the top rung (:meth:`~LadderModel.on_splits_chosen`: the splits a
  trial found exact, e.g. 2, 4, 8): the step's batch runs in that many chunks, the optimizer
  stepping once, so the activations shrink with the chunk; exact too (up to BatchNorm's
  statistics), the slowest of the exact levers. The rungs, then the splits, are the **exact
  points** (:mod:`~lightning_bandlimit.ladder.exact`).
* **the compression continuum** above the floor (lossy), at the largest split, on the **lossy
  rung**: the top rung when the checkpointed blocks keep only their kept spectrum
  (:mod:`lightning_bandlimit.recompute.spectral`; :meth:`LadderController.on_continuum_chosen`),
  so that more compression also shrinks what the checkpointed blocks keep and the continuum
  goes on where the exact rungs stop; else rung 0, because a block checkpointed the ordinary
  way keeps its input at full size while a memory-lean band-limited block keeps only its kept
  spectrum, and the continuum starts where a compression on rung 0 is predicted to need less
  than the top rung.

The controller is plain Python (no Lightning, no torch). Its state changes only through its
methods, each named for the event it takes: a measured step (:meth:`~LadderModel.observe`,
:meth:`~LadderModel.observe_time`), the stages measured or counted
(:meth:`~LadderController.on_stages_measured`, :meth:`~LadderModel.on_continuum_chosen`), the splits
tried (:meth:`~LadderModel.on_splits_chosen`), the ranks agreeing on the top rung, the continuum and
the splits (:meth:`~LadderModel.on_ranks_agreed`), a check (:meth:`LadderController.decide`, fed one
:class:`~lightning_bandlimit.ladder.setting.FreeMemory` reading and the memory of peers), a change
it did not decide (:meth:`LadderController.on_outside_change`) and an out-of-memory error
(:meth:`LadderController.on_oom`: the top rung if below it, then the largest split, then more
compression, which releases never go below again). A check decides with thresholds, hysteresis
and a cooldown (where each move goes: :mod:`~lightning_bandlimit.ladder.moves`):

* **Pressure** (free below ``min_free``): the least lossy setting predicted to free the missing
  bytes (plus the *surprise*: how much more the job measured at the setting it changed to than
  it had predicted there; memory other jobs took while it held is the deficit, never surprise;
  plus the *trend*: others' growth over each of the last two checks (the total less the free
  bytes and the job's own measured peak, so it is seen while the job changes its setting too),
  expected once more, so a sustained ramp is met ahead and a single jump is not counted twice).
  A rung's memory is what the job measured on it at the step's peak, over the job's baseline
  (what it holds between steps, :class:`~lightning_bandlimit.ladder.learned.LadderModel`): the
  baseline may grow, the increment is the rung's; a rung not visited yet is
  predicted conservatively, as freeing nothing over the measured rung below it, wherever the
  ladder relies on a prediction (to stop climbing, to compress, to release). Which unvisited
  rung to try first is hinted by the bytes its stages keep for backward (measured once,
  :meth:`~LadderController.on_stages_measured`), discounted by what the last climb freed of its
  stage's bytes, once more for each stage further up (returns diminish: the step's peak moves
  away from the stages): the least rung they say is enough, exact either way, else the top
  rung at once (exact, and the most any rung frees). Beyond the top rung the splits on it, the
  same way: the least split measured, else hinted (its peak ``G + A / split`` through the
  measured splits, :class:`~lightning_bandlimit.ladder.splits.SplitMemory`), to be enough, else
  the largest split at once while it was not measured (a split not measured is predicted
  conservatively too: freeing nothing over the split below it). Beyond the largest split the
  least compression its learned memory-versus-compression model predicts to fit, and only one
  predicted to need less than every smaller compression (a compression that costs memory is
  never picked), and ``max_compression`` when the model says none is enough; with no model
  yet, on the top rung one ``raise_step`` more, on rung 0
  ``max_compression`` (only a large compression is sure to free more than the top rung did),
  and after a raise measured not to lower memory ``max_compression`` at once (never a second
  step into the unknown while over budget), given back at the next release as far as the
  model then learned allows. No lossy change and no split is made for a shortfall within the
  noise of the job's own peak (:attr:`~LadderModel.peak_noise`: the most it moved between
  consecutive checks at one setting, lately) while that much is still free: a host's resident
  set moves by about a MiB between steps, and a compression would cost accuracy (a split,
  time) for a shortfall the measurement cannot tell from none (the exact rungs still take any
  shortfall; a surprise counts only beyond that noise too).
* **Hold** between ``min_free`` and ``release_free``.
* **Release** (``release_checks`` calm checks and a cooldown): the lossy part first (to the
  fastest exact point measured to keep ``release_free`` free, else to the least compression
  predicted to, else by ``lower_step``), then the splits, to the fastest exact point with fewer
  chunks predicted to keep it free (a chunk ``m`` times larger keeps at most ``m`` times the
  increment where not measured; else one split down), then the exact rungs, to the lowest rung
  predicted to keep it free (else one rung), so a job with no pressure runs at plain speed.
  Going down, a rung not visited yet is bounded by the stages' saved bytes: un-checkpointing a
  stage adds at most what it keeps for backward, so a job that started on its top rung (beside
  peers) goes down to rung 0 in one change when that much is spare, not one rung at a time.

``max_slowdown`` caps the time cost: a rung whose measured step time exceeds it (relative to
rung 0) and every rung above it leave the ladder; the continuum then starts below them. A rung
measured to free less than a quarter of what its stages keep for backward (judged against the
least they may keep, never an upper figure such as the one measured on samples; the step's peak
lies elsewhere) leaves the ladder the same way, with the rungs above it: it would
cost recompute time and free nothing. A job on a rung that left the ladder comes down to the
top rung only when what the rung measured to free fits the spare memory (an idle rung may free
up to a quarter of its stage, a slow one anything); else it keeps the rung. (Beside the climb's
hint, the stages' saved bytes serve only this judgement: the step's peak is not where they are
kept.)
With ``rungs=0`` the ladder is the compression continuum alone.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from lightning_bandlimit.ladder.growth import OthersGrowth
from lightning_bandlimit.ladder.memory_model import threshold_bytes
from lightning_bandlimit.ladder.moves import LadderMoves
from lightning_bandlimit.ladder.reasons import HOLD, LOWER, RAISE
from lightning_bandlimit.ladder.setting import (
    Decision,
    FreeMemory,
    Setting,
    measured_from_state,
    measured_state,
)
from lightning_bandlimit.utils.validation import check_int, check_real

__all__ = ["LadderController"]


class LadderController(LadderMoves):
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
        >>> from lightning_bandlimit.memory.protocol import MemoryReading
        >>> ladder = LadderController(rungs=2, min_free=100, release_free=300)
        >>> ladder.observe(Setting(0, 0.0), 1000)
        >>> short = MemoryReading(total=2000, free=50, source="scripted")  # 50 bytes short (+10 %)
        >>> ladder.decide(short, Setting(0, 0.0))  # no rung visited yet: the top one, exact
        Decision(rung=2, compression=0.0, reason='raise', free=50, threshold=100)
        >>> ladder.observe(Setting(2, 0.0), 600); ladder.observe(Setting(1, 0.0), 900)
        >>> ladder.decide(short, Setting(0, 0.0))  # rung 1 measured to free 100: enough
        Decision(rung=1, compression=0.0, reason='raise', free=50, threshold=100)
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
        super().__init__(rungs, min_compression, max_compression, max_slowdown)
        check_real("min_free", min_free, minimum=0, min_open=True)
        release_free = 2 * min_free if release_free is None else release_free
        check_real("release_free", release_free, minimum=0, min_open=True)
        if (min_free < 1) != (release_free < 1) or release_free <= min_free:
            raise ValueError(
                "release_free must be above min_free and in the same unit (both fractions < 1 or "
                f"both bytes), got min_free={min_free}, release_free={release_free}"
            )
        self.raise_step = check_real("raise_step", raise_step, minimum=0, min_open=True)
        self.lower_step = check_real("lower_step", lower_step, minimum=0, min_open=True)
        self.release_checks = check_int("release_checks", release_checks, minimum=1)
        self.cooldown_checks = check_int("cooldown_checks", cooldown_checks, minimum=0)
        self.margin = check_real("margin", margin, minimum=0)
        self.min_free, self.release_free = min_free, release_free
        self.oom_floor = self.min_compression
        self._calm = 0
        self._since_change = cooldown_checks
        self._expected: tuple[Setting, float] | None = None  # a change's target and predicted peak
        self._others = OthersGrowth()
        self._peer_memory: float | None = None  # and as the last check was given it
        self._decided_observations = 0  # observations (LadderModel.observations) at the last check
        self.min_free_bytes: int | None = None  # min_free in bytes at the last reading
        self.release_free_bytes: int | None = None  # and release_free

    def decide(self, reading: FreeMemory, current: Setting, peer_memory: float | None = None) -> Decision:
        """A check: the setting for the next steps, given a reading taken at ``current``.

        Args:
            reading: the device's free and total memory.
            current: the setting the job ran at since the last check.
            peer_memory: the memory other memory-aware jobs on the device hold now, bytes
                (``SharedDevice``: what the device measures for their processes, or what they
                published); their own changes are not others' growth. ``None``: no such jobs,
                or not known.
        """
        self._peer_memory = peer_memory
        decision = self._decide(reading, current, peer_memory)
        target = decision.setting
        predicted = None if target == current else self.predict(target)
        self._expected = None if predicted is None else (target, predicted)
        return decision

    @property
    def peer_memory(self) -> float | None:
        """The peers' memory the last :meth:`decide` was given (bytes; ``None``: none given)."""
        return self._peer_memory

    def surprise(self, current: Setting) -> float:
        """How much more memory the job measured at ``current`` than it predicted there when it
        changed to it, beyond the noise of its peak (:attr:`peak_noise`); ``0`` after a hold, or
        before the measurement."""
        if self._expected is None or self._expected[0] != current:
            return 0.0
        measured = self.predict(current)
        return 0.0 if measured is None else max(0.0, measured - self._expected[1] - self.peak_noise)

    def _decide(self, reading: FreeMemory, current: Setting, peer_memory: float | None) -> Decision:
        low = threshold_bytes(self.min_free, reading.total)
        high = threshold_bytes(self.release_free, reading.total)
        self.min_free_bytes, self.release_free_bytes = low, high
        self._since_change += 1
        surprise = self.surprise(current)
        # the job's peak measured since the last check, if any (one measurement per decision)
        fresh = self.observations > self._decided_observations
        self._decided_observations = self.observations
        observed = self.last_observation if fresh else None
        trend = self._others.check(current, reading, observed, peer_memory)
        if reading.free < low:
            self._calm = 0
            shortfall = low - reading.free + surprise + trend
            # others still growing would take the job over budget by the next check if the
            # change freed nothing: no try of a rung or compression whose memory is unknown
            ramp = self._others.ramp
            sure = ramp > 0 and reading.free < ramp
            target = self._escalate(current, shortfall * (1 + self.margin), sure)
            costly = target.compression > current.compression or target.split > current.split
            if costly and shortfall <= self.peak_noise < reading.free:
                # a shortfall within the noise of the job's own peak, and that noise still free: no
                # lossy change and no split for it (the slowest exact lever, inexact with
                # BatchNorm); the rungs still take any shortfall
                target = replace(current, rung=min(current.rung, self.top))
                reason = LOWER if target.rung < current.rung else RAISE
                return self._change(target, current, reason, reading.free, low)
            return self._change(target, current, RAISE, reading.free, low)
        if current.rung > self.top:  # above a rung that left the ladder: faster, about the same memory
            peak = self.predict(current)
            if peak is None or self._added(self.top, current.rung, peak) <= self.spare(reading.free):
                return self._change(replace(current, rung=self.top), current, LOWER, reading.free, low)
            # a rung judged idle may still free up to a quarter of its stage (and one too slow,
            # anything): going down only when what it measured to free fits what is spare
        if reading.free < high:
            self._calm = 0
            return Decision.at(current, HOLD, reading.free, low)
        self._calm += 1
        if self._calm < self.release_checks or self._since_change <= self.cooldown_checks:
            return Decision.at(current, HOLD, reading.free, high)
        return self._change(self._release(current, reading.free - high), current, LOWER, reading.free, high)

    def spare(self, free: float) -> float:
        """Of ``free`` bytes, what is beyond ``min_free`` (as of the last reading, with the
        margin) and the noise of the job's peak: what a move down may add.

        Example:
            >>> from lightning_bandlimit.memory.protocol import MemoryReading
            >>> ladder = LadderController(rungs=1, min_free=100, margin=0.1)
            >>> _ = ladder.decide(MemoryReading(total=5000, free=300, source="scripted"), Setting(0, 0.0))
            >>> ladder.spare(300)
            190.0
        """
        low = self.min_free_bytes or 0
        return free - low * (1 + self.margin) - self.peak_noise

    def _shift(self, delta: float) -> None:
        super()._shift(delta)
        if self._expected is not None:  # a prediction is of the increment too
            self._expected = (self._expected[0], self._expected[1] + delta)

    def on_outside_change(self) -> None:
        """A change this controller did not decide (the jobs' shared rule, an out-of-memory
        retry): the cooldown restarts, and its last prediction and trend no longer hold."""
        self._since_change = 0
        self._calm = 0
        self._expected = None
        self._others.reset()

    def on_oom(self, current: Setting) -> Setting:
        """An out-of-memory error at ``current``: the setting to retry the step with (the top
        rung if below it, else more compression, which releases never go below again)."""
        self.on_outside_change()
        retry = self._retry_after_oom(current)
        self.oom_floor = max(self.oom_floor, retry.compression)
        return retry

    def _change(self, target: Setting, current: Setting, reason: str, free: int, threshold: int) -> Decision:
        if target == current:
            return Decision.at(current, HOLD, free, threshold)
        self._since_change = 0
        self._calm = 0
        return Decision.at(target, reason, free, threshold)

    def state_dict(self) -> dict[str, Any]:
        return {
            "rungs": self.rungs,
            "top": self.top,
            "rung_memory": self.rung_memory.state_dict(),
            "compression_memory": self.compression_memory.state_dict(),
            "rung_seconds": [[r, s] for r, s in sorted(self.rung_seconds.items())],
            "stage_savings": self.stage_savings,
            "stage_least": self.stage_least,
            "oom_floor": self.oom_floor,
            "continuum_on_top": self.continuum_on_top,
            "calm": self._calm,
            "since_change": self._since_change,
            "expected": measured_state(self._expected),
            **self._others.state_dict(),
            "peak_jitter": list(self.peak_jitter),
            "baseline": self.baseline,
            "splits": list(self.splits),
            "split_memory": self.split_memory.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a :meth:`state_dict`. Before the stages
        are known (:meth:`~LadderModel.on_stages_measured` not called yet) the saved number of rungs is taken;
        a ladder with another number keeps only what does not depend on them (the compression
        model, the out-of-memory floor)."""
        saved_rungs = int(state.get("rungs", self.rungs))
        if saved_rungs != self.rungs and self.rungs == 0 and self.stage_savings is None:
            self.rungs = self.top = saved_rungs  # stages not measured yet: the saved ones
        self.continuum_on_top = bool(state.get("continuum_on_top", False))
        self.compression_memory.load_state_dict(state.get("compression_memory", {}))
        self.oom_floor = float(state.get("oom_floor", self.min_compression))
        self._calm = int(state.get("calm", 0))
        self._since_change = int(state.get("since_change", self.cooldown_checks))
        self._expected = measured_from_state(state.get("expected"))
        self._others.load_state_dict(state)
        self.peak_jitter.clear()
        self.peak_jitter.extend(float(j) for j in state.get("peak_jitter", []))
        baseline = state.get("baseline")
        self.baseline = None if baseline is None else float(baseline)  # the learned peaks' baseline
        if saved_rungs != self.rungs:
            return
        self.top = min(int(state.get("top", self.rungs)), self.rungs)
        self.splits = tuple(int(s) for s in state.get("splits", []))
        self.split_memory.load_state_dict(state.get("split_memory", {}))
        self.rung_memory.load_state_dict(state.get("rung_memory", {}))
        self.rung_seconds = {int(r): float(s) for r, s in state.get("rung_seconds", [])}
        savings, least = state.get("stage_savings"), state.get("stage_least")
        self.stage_savings = None if savings is None else [float(s) for s in savings]
        self.stage_least = None if least is None else [float(s) for s in least]
