"""One ladder across a device's tenants: the cheapest lever across all jobs moves first.

Each job's controller decides from the device's free memory as if it were alone; its
:class:`Coordination` then looks at the same ledger snapshot as every other job and lets the
decision through or turns it into a hold, by one rule that every job applies alike (no job
waits for an answer from another):

* **Under a shortfall** a job moves when no cheaper move of another job covers it: every exact
  move of every job comes before any job compresses (a job whose next move is lossy holds while a
  peer has an exact rung left), and among moves of one kind the cheapest first (measured slowdown
  per GiB freed; among moves not measured yet the one predicted to free the most; then the
  job's name), each counting what it is predicted to free (a move whose
  saving is unknown is taken to cover the shortfall: it will be measured at the next check).
  A job whose peer changed within ``dwell`` seconds holds: that change is not in the readings
  yet (the remedy for controllers that react to one signal out of step).
* **On release** the lossy part goes first, across jobs (a job that would give back an exact
  rung holds while a peer is compressed), one job at a time: the most lossy first.
* **Never overdraw to be polite**: with nothing free (over budget) a job moves at once, and once
  it has held ``patience`` checks in total since a shortfall began (its own moves and its peers'
  do not start the count afresh; a check without a shortfall does) it moves whatever the others
  offer (but an exact rung is not given back while a peer compresses).
* **Trust is bounded** (:mod:`lightning_bandlimit.tenants.trust`): a peer's claim of what its
  next move frees counts at most what the device measures for its process; a peer seen arriving
  for longer than its wait and first step is taken to have arrived (:meth:`Coordination.expire`),
  whatever its heartbeat says; a lossy lever that has kept this job's exact rung for longer than
  ``lossy_timeout`` seconds (and more than ``patience`` checks) no longer keeps it.
* **Room for an arrival**: while a peer arrives (its first step, which measures it, not run
  yet), a job gives nothing back and makes room for it by exact rungs, one job at a time, the
  cheapest first (:meth:`Coordination.arrivals`); the newcomer's top rung, taken before anything
  of it was measured, goes down once to what a run of its model measured to fit
  (:meth:`Coordination.refit`). The protocol's states, events and the room it makes are in
  :mod:`lightning_bandlimit.tenants.arrival` (one table).
* **A rung that frees nothing is not given**: going down from a rung measured idle to the one
  below it is let through at once, arrival or not (the same memory, faster).

A job with no peers is let through unchanged, as is every hold: alone, a job behaves exactly as
without the ledger.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from lightning_bandlimit.ladder.controller import LadderController
from lightning_bandlimit.ladder.reasons import HOLD, LOWER, RAISE
from lightning_bandlimit.ladder.setting import Decision, Setting
from lightning_bandlimit.tenants.arrival import room_needed, room_to_free
from lightning_bandlimit.tenants.ledger import Tenant
from lightning_bandlimit.tenants.trust import ARRIVAL_TIMEOUT_S, LOSSY_HOLD_TIMEOUT_S, Expiry
from lightning_bandlimit.utils.units import GIB, MIB
from lightning_bandlimit.utils.validation import check_int, check_real

__all__ = ["TWIN_TOLERANCE", "Coordination", "offer"]

# ratio: a peer is a twin (a run of the same model) when, stage by stage, the least and the most
# its stage may free meet this job's within it. A plain step measures one figure and samples a
# range as wide as the stage's inputs; a torchvision resnet18 measured both ways (a user trial)
# had ranges that meet, where by the least alone its stage 1 differed by 10.3 %
TWIN_TOLERANCE = 1.1


def offer(controller: LadderController, current: Setting) -> dict[str, object]:
    """What a job publishes of itself at ``current``: its measured peak there, whether it holds a
    lossy lever, whether an exact rung is left, and its next move's kind, predicted saving and
    measured cost (:class:`~lightning_bandlimit.tenants.ledger.Tenant`'s fields).

    Example:
        >>> ladder = LadderController(rungs=2, min_free=100)
        >>> ladder.on_stages_measured([300.0, 100.0]); ladder.observe(Setting(0, 0.0), 1000)
        >>> offer(ladder, Setting(0, 0.0))["next_freed"]  # rung 1 not visited: its stage's hint
        300.0
    """
    exact = current.compression <= controller.min_compression
    ladder = controller.exact_points()  # rungs, then splits on the top rung
    left = ladder[ladder.index(current) + 1 :] if current in ladder else []
    entry: dict[str, object] = {
        "rung": current.rung,
        "compression": current.compression,
        "lossy": not exact,
        "exact_left": exact and bool(left),
        "next_freed": None,
        "next_lossy": None,
        "next_cost": None,
    }
    peak_now = controller.predict(current)
    entry["memory"] = None if peak_now is None else int(peak_now)  # its measured peak there
    points = controller.rung_memory.points
    top = _top_memory(controller)
    entry["top_memory"] = None if top is None else int(top)
    entry["rung_peaks"] = tuple((int(r), int(b)) for r, b in sorted(points.items()))
    entry["stage_least"] = tuple(int(s) for s in controller.stage_least or ())
    entry["stage_most"] = tuple(int(s) for s in controller.stage_savings or ())
    entry["idle_from"] = controller.idle_from()
    if entry["exact_left"]:
        upper = left[0]  # the next rung, or the next split (its saving hinted until measured)
        freed = None
        if peak_now is not None and (after := controller.hinted(upper, peak_now)) is not None:
            freed = peak_now - after if upper.split > 1 or upper.rung in points else None
        if freed is None and upper.split == 1 and controller.stage_savings is not None:
            freed = controller.stage_savings[current.rung]
        slower = controller.slowdown(upper.rung, upper.split)
        base = controller.slowdown(current.rung, current.split) if current != ladder[0] else 1.0
        cost = None
        if freed is not None and freed > 0 and slower is not None and base is not None:
            cost = max(0.0, slower - base) / (freed / GIB)
        entry.update(next_freed=freed, next_lossy=False, next_cost=cost)
    elif controller.lossy and current.compression < controller.max_compression:
        target = controller.clamp(current.compression + controller.raise_step)
        after = controller.predict(Setting(controller.lossy_rung, target, split=controller.lossy_split))
        freed = None if peak_now is None or after is None else max(0.0, peak_now - after)
        entry.update(next_freed=freed, next_lossy=True)
    return entry


class Coordination:
    """Lets a job's decisions through, or holds them, by the rule of the module docstring.

    Args:
        dwell: seconds after a peer's change during which a job holds (its effect is not in the
            readings yet).
        patience: checks a job holds in total under one shortfall before it moves anyway (on
            release: in a row, until its own move).
        arrival_timeout: the most seconds a newcomer waits for room: a peer this job has seen
            arriving for longer than that and
            :data:`~lightning_bandlimit.tenants.trust.FIRST_STEP_S` is taken to have arrived
            (:meth:`expire`).
        lossy_timeout: seconds a peer's lossy lever may keep this job's exact rung on release
            (it must also have kept it more than ``patience`` checks) before it no longer does.

    Raises:
        ValueError: for a negative ``dwell``, ``arrival_timeout`` or ``lossy_timeout``, or a
            ``patience`` below 1.

    Example:
        >>> rule = Coordination(dwell=0.0)
        >>> me = Tenant("b", 2, 0.0, exact_left=True, next_freed=64.0, next_lossy=False)
        >>> peer = Tenant("a", 1, 0.0, exact_left=True, next_freed=64.0, next_lossy=False)
        >>> squeeze = Decision(1, 0.0, "raise", free=50, threshold=100)  # 50 bytes short
        >>> rule.decide(squeeze, Setting(0, 0.0), me, [peer], at=1.0)[0].reason  # a's move covers it
        'hold'
        >>> rule.decide(squeeze, Setting(0, 0.0), me, [], at=1.0)[0].reason  # alone
        'raise'
    """

    def __init__(
        self,
        dwell: float = 0.0,
        patience: int = 3,
        arrival_timeout: float = ARRIVAL_TIMEOUT_S,
        lossy_timeout: float = LOSSY_HOLD_TIMEOUT_S,
    ) -> None:
        self.dwell = check_real("dwell", dwell, minimum=0)
        self.patience = check_int("patience", patience, minimum=1)
        self.arrival_timeout = check_real("arrival_timeout", arrival_timeout, minimum=0)
        self.lossy_timeout = check_real("lossy_timeout", lossy_timeout, minimum=0)
        self.held_checks = 0  # checks held under this shortfall (out of one: in a row, on release)
        self.short = False  # whether the last check decided was under a shortfall
        self.expiry = Expiry()  # when peers were first seen arriving, or keeping a rung by a lossy lever

    def decide(
        self, decision: Decision, current: Setting, me: Tenant, peers: Sequence[Tenant], at: float
    ) -> tuple[Decision, str | None]:
        """``decision`` or a hold at ``current``, and why it was held (``None``: let through);
        ``at``: the time of the check (the ledger's clock). Holds are counted over a whole
        shortfall, not per move: a peer always offering a cheaper move holds the job ``patience``
        checks in all."""
        short = decision.free < decision.threshold
        if short != self.short:  # a shortfall began or ended: the wait is counted afresh
            self.held_checks, self.short = 0, short
        self.expiry.lossy_seen({p.job for p in peers if p.lossy}, short)
        why, firm = (None, False) if not peers else self._why_hold(decision, me, peers, at)
        if why is not None and not firm:
            self.held_checks += 1
            if (decision.reason == RAISE and decision.free <= 0) or self.held_checks > self.patience:
                why = None  # never overdraw to be polite, nor wait on a peer for ever
        if why is None:
            if decision.reason != HOLD and not short:
                self.held_checks = 0  # a release let through; under a shortfall the count goes on
            return decision, None
        return Decision.at(current, HOLD, decision.free, decision.threshold), why

    def expire(self, peers: Sequence[Tenant], at: float) -> list[Tenant]:
        """``peers``, each one this job has seen arriving for longer than ``arrival_timeout`` (and a
        first step's time) before ``at`` taken to have arrived, whatever its heartbeat says: an
        entry claiming to arrive for ever no longer stops this job giving back
        (:meth:`~lightning_bandlimit.tenants.trust.Expiry.arrivals`)."""
        return self.expiry.arrivals(peers, at, self.arrival_timeout)

    def _why_hold(
        self, decision: Decision, me: Tenant, peers: Sequence[Tenant], at: float
    ) -> tuple[str | None, bool]:
        """Why to hold (``None``: no reason) and whether the hold is firm (patience does not end
        it: an exact rung kept while a peer compresses)."""
        if decision.reason not in (RAISE, LOWER) or _same_memory(decision, me):
            return None, False
        if (recent := self._recent(peers, at)) is not None:
            return recent, False
        if decision.reason == RAISE:
            return _why_hold_raise(decision, me, peers), False
        if not me.lossy and any(p.lossy for p in peers):
            keeping = self.expiry.lossy_keeping(peers, at, self.lossy_timeout, self.patience)
            if keeping:
                lossy = ", ".join(keeping)
                return f"{lossy} still compress: lossy levers are given back first, across jobs", True
            expired = set(self.expiry.lossy_since)
            peers = [p for p in peers if p.job not in expired]  # their turn has passed
        return _why_hold_release(me, peers), False

    def arrivals(
        self,
        decision: Decision,
        current: Setting,
        me: Tenant,
        peers: Sequence[Tenant],
        at: float,
        controller: LadderController,
    ) -> tuple[Decision, tuple[str, ...], str | None]:
        """``decision`` while peers arrive (``Tenant.arriving``), the arrivals this check
        confirms room for (found free, left to a cheaper peer's move, or nothing exact left to
        give; room made by a move is confirmed at the next check, once a step at the new setting
        measured it), and why it changed (``None``: not changed); ``at``: the time of the check.
        A raise of the job's own goes through :meth:`decide` instead (returned unchanged, no room
        confirmed). The protocol's steps: :mod:`lightning_bandlimit.tenants.arrival`.

        Example:
            >>> ladder = LadderController(rungs=2, min_free=100)
            >>> ladder.on_stages_measured([300.0, 100.0]); ladder.observe(Setting(0, 0.0), 1000)
            >>> me = Tenant("a", 1, 0.0, memory=1000)
            >>> newcomer = Tenant("b", 2, 0.0, arriving=True, held=600)  # 400 more like a's
            >>> calm = Decision(0, 0.0, "hold", free=350, threshold=100)  # 150 short of that
            >>> rule = Coordination()
            >>> decision, room_for, why = rule.arrivals(calm, Setting(0, 0.0), me, [newcomer], 1.0, ladder)
            >>> decision.setting, room_for  # confirmed once a step on rung 1 measured it
            (Setting(rung=1, compression=0.0), ())
        """
        arriving = [p for p in peers if p.arriving]
        names = tuple(p.job for p in arriving)
        if not arriving or decision.reason == RAISE:
            return decision, (), None
        kept = _nothing_given_back(decision, current, me)
        if (estimate := _first_step_estimate(peers, current, controller)) is None:
            return kept, names, None  # nothing measured here: no estimate to make room for
        # room this job confirmed already: that newcomer may be running its first step, its
        # memory is in the readings now (counting it again would make room twice)
        waiting = [p for p in arriving if p.job not in me.room_for]
        need = room_needed(estimate.need, [p.held for p in waiting])
        low = decision.threshold if controller.min_free_bytes is None else controller.min_free_bytes
        deficit = need + low - decision.free  # to keep min_free free after the arrival
        who = ", ".join(names)
        if deficit <= controller.peak_noise:  # room found: short by no more than the peak's noise
            return kept, names, None if kept is decision else f"{who} arrives: nothing given back"
        if (recent := self._recent(peers, at)) is not None:  # not in the readings: nothing confirmed
            return kept, (), recent
        settled = [p for p in peers if not p.arriving]
        short = Decision.at(current, RAISE, decision.free, int(low + need))
        cheaper = _why_hold_raise(short, me, settled)
        floor = max([*estimate.others_least, *(float(p.held or 0) for p in waiting)], default=0.0)
        own_peak = estimate.need if estimate.own else None
        to_free = room_to_free(deficit, len(waiting), own_peak, floor)
        target = controller.make_room(current, to_free * (1 + controller.margin))
        if cheaper is not None or target == current:  # left to a cheaper move, or nothing exact left
            return kept, names, cheaper or f"{who} arrives: no exact rung left to make room"
        if (first := _making_room_first(me, settled, names)) is not None:
            return kept, (), first  # not confirmed: this job's turn comes when theirs is done
        why = f"making room for {who}: {deficit / MIB:.1f} MiB, as much as a job here measured"
        why += estimate.where
        # confirmed at the next check, by a step measured at the new setting
        return Decision.at(target, RAISE, decision.free, decision.threshold), (), why

    def refit(
        self,
        decision: Decision,
        current: Setting,
        peers: Sequence[Tenant],
        at: float,
        controller: LadderController,
    ) -> tuple[Decision, str | None]:
        """A hold on an exact rung taken before the job was measured (an arrival's top rung) goes
        down to the fastest exact rung that keeps ``min_free`` free (with the ladder's margin,
        on both, and its peak's noise; a rung that needs more memory also keeps the margin of the
        hold band, ``release_free - min_free``, as slack) by what a run of the same model
        measured: a peer whose stages free the same (the ranges :attr:`Tenant.stage_least` to
        ``stage_most`` of each stage meet, within :data:`TWIN_TOLERANCE`) and that measured both
        rungs adds its difference to the job's measured peak (the largest such difference); where
        no such peer measured the job's rung, the peer's peak on the rung against the job's own
        (the room for the arrival was sized on that peer's peak: runs of one model need the
        same). A rung the peer measured idle, and those above it, count at the memory of the
        rung below them (the ladder's own rule). ``decision`` unchanged (and ``None``) under
        pressure or above the hold band, while a peer arrives or changed within ``dwell`` of
        ``at`` (the time of the check), or when no rung is known to fit.

        Example:
            >>> from lightning_bandlimit.memory.protocol import MemoryReading
            >>> ladder = LadderController(rungs=2, min_free=100, margin=0.0)
            >>> ladder.on_stages_measured([300.0, 100.0]); ladder.observe(Setting(2, 0.0), 1000)
            >>> calm = ladder.decide(MemoryReading(total=5000, free=150, source="scripted"), Setting(2, 0.0))
            >>> peaks = ((0, 1300), (1, 1040), (2, 1000))  # a run of the same model
            >>> twin = Tenant("a", 1, 0.0, rung_peaks=peaks, stage_least=(300, 100), stage_most=(300, 100))
            >>> Coordination().refit(calm, Setting(2, 0.0), [twin], 1.0, ladder)[0].setting  # rung 1: +40
            Setting(rung=1, compression=0.0)
        """
        low = controller.min_free_bytes
        mine = controller.rung_memory.points
        if (
            decision.reason != HOLD
            or low is None
            or decision.threshold != low  # above the hold band: the release takes it
            or current.compression > controller.min_compression
            or current.rung not in mine
            or any(p.arriving for p in peers)
            or self._recent(peers, at) is not None
        ):
            return decision, None
        spare = controller.spare(decision.free)
        # a move nobody asked for lands a job at the bottom of the hold band, where the ladder's
        # own release never does (it goes down from above release_free): peaks creep over a run
        # (a MiB or two on the quickstart CPU job, whose band is 62), and a job landed at the edge
        # climbs back at once; so a rung that adds memory keeps the margin of the band as slack
        slack = controller.margin * max(0, (controller.release_free_bytes or low) - low)
        twins = [_twin_peaks(p, controller.rungs) for p in peers if _same_stages(p, controller)]
        for rung in range(current.rung):  # the fastest first
            added = [t[rung] - t[current.rung] for t in twins if rung in t and current.rung in t]
            if not added:  # no twin measured this job's rung: a twin's peak there against its own
                added = [t[rung] - mine[current.rung] for t in twins if rung in t]
            if rung in mine:
                added = [mine[rung] - mine[current.rung]]
            need = max(added, default=0) * (1 + controller.margin)  # a measure has its noise too
            if added and need + (slack if need > 0 else 0) <= spare:
                why = f"the top rung taken on arrival is more than needed: rung {rung} fits, a twin measured"
                return Decision(rung, current.compression, LOWER, decision.free, low), why
        return decision, None

    def _recent(self, peers: Sequence[Tenant], at: float) -> str | None:
        """Why to wait for peers that changed within ``dwell`` seconds of ``at`` (``None``: none did)."""
        recent = [p.job for p in peers if at - p.changed_at < self.dwell]
        if not recent:
            return None
        return f"{', '.join(recent)} changed within {self.dwell:g} s: not in the readings yet"

    def state_dict(self) -> dict[str, int]:
        return {"held_checks": self.held_checks, "short": int(self.short)}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.held_checks = int(state.get("held_checks", 0))
        self.short = bool(state.get("short", False))


def _top_memory(controller: LadderController) -> float | None:
    """The job's measured peak on its top rung (``None``: not measured there, or no rungs)."""
    return controller.rung_memory.points.get(controller.top) if controller.top else None


class _Estimate(NamedTuple):
    """What an arrival's first step is taken to need (:func:`_first_step_estimate`)."""

    need: float  # bytes, before what the arrival holds
    where: str  # where a job measured it, for the reason given
    own: bool  # it is this job's own peak at its setting: what a rung frees lowers it too
    others_least: list[float]  # the settled peers' least peaks on an exact rung


def _first_step_estimate(
    peers: Sequence[Tenant], current: Setting, controller: LadderController
) -> _Estimate | None:
    """What an arrival's first step (on its top rung) is taken to need: the largest peak a job
    here measured on its top rung; else the largest of each job's least peak on an exact rung (a
    rung more never needs more memory); else the largest memory measured here. ``None`` when
    nothing is measured here (no peer's memory, none of this job's)."""
    settled = [p for p in peers if not p.arriving]
    known = [float(p.memory) for p in settled if p.memory is not None]
    known += [*controller.rung_memory.points.values(), *controller.compression_memory.points.values()]
    if not known:
        return None
    tops = [float(p.top_memory) for p in settled if p.top_memory is not None]
    mine = _top_memory(controller)
    tops += [] if mine is None else [mine]
    leasts = [_least_peak(p) for p in settled if p.rung_peaks or p.memory is not None]
    least = min(controller.rung_memory.points.values(), default=None)  # this job's own
    if tops:
        return _Estimate(max(tops), " on its top rung", False, leasts)
    if leasts or least is not None:
        need = max(leasts + ([] if least is None else [least]))
        own = least is not None and least == need and controller.predict(current) == least
        return _Estimate(need, " on its highest rung", own, leasts)
    return _Estimate(max(known), "", False, leasts)


def _nothing_given_back(decision: Decision, current: Setting, me: Tenant) -> Decision:
    """``decision``, but a release held while a peer arrives (a rung that frees nothing, down
    from one measured idle, is not giving: it goes through)."""
    if decision.reason == LOWER and not _same_memory(decision, me):
        return Decision.at(current, HOLD, decision.free, decision.threshold)
    return decision


def _least_peak(peer: Tenant) -> float:
    """A peer's least peak on an exact rung (its memory where it measured none)."""
    return float(min(b for _, b in peer.rung_peaks) if peer.rung_peaks else peer.memory)  # type: ignore[arg-type]


def _twin_peaks(peer: Tenant, rungs: int) -> dict[int, int]:
    """A twin's measured peak per rung, and on the rungs from its idle one up (measured to free
    next to nothing over the rung below, :attr:`Tenant.idle_from`) the rung below's: the
    ladder's own rule for a rung above its top (the same memory, faster)."""
    peaks = dict(peer.rung_peaks)
    idle = peer.idle_from
    if idle is not None and idle - 1 in peaks:
        for rung in range(idle, rungs + 1):
            peaks.setdefault(rung, peaks[idle - 1])
    return peaks


def _same_stages(peer: Tenant, controller: LadderController) -> bool:
    """Whether a peer's stages free what this job's do: for each stage, the ranges from the
    least to the most it may free meet (within :data:`TWIN_TOLERANCE`). Runs of one model, one
    measured in a plain step and one on samples, do; another model's stages do not."""
    least, most = controller.stage_least, controller.stage_savings
    if not least or not most or not (len(peer.stage_least) == len(peer.stage_most) == len(least)):
        return False
    ranges = zip(peer.stage_least, peer.stage_most, least, most)
    return all(max(a, c) <= TWIN_TOLERANCE * min(b, d) for a, b, c, d in ranges)


def _same_memory(decision: Decision, me: Tenant) -> bool:
    """Whether ``decision`` goes down from a rung measured idle (:attr:`Tenant.idle_from`, or
    one above it) to the rung below it: the same memory, faster, nothing for peers to weigh."""
    idle = me.idle_from
    return (
        decision.reason == LOWER
        and idle is not None
        and me.rung >= idle
        and decision.rung == idle - 1
        and decision.compression == me.compression
    )


def _order(tenant: Tenant) -> tuple[float, float, str]:
    """Which job's next move comes first: the cheapest (measured slowdown per GiB freed; a move
    not measured yet counts as free, to be measured), then the one predicted to free the most
    (among moves not measured yet: a stage's recompute costs about the same whichever it is, so
    the most freed is the least cost per byte, and the fewest moves), then the job's name."""
    return (tenant.next_cost or 0.0, -(tenant.next_freed or 0.0), tenant.job)


def _why_hold_raise(decision: Decision, me: Tenant, peers: Sequence[Tenant]) -> str | None:
    """Why to hold a raise (``None``: no reason): a peer has an exact rung left and the move
    compresses, or cheaper moves of peers cover the shortfall."""
    lossy = decision.compression > me.compression or me.lossy  # my move compresses
    if lossy:
        exact = [p.job for p in peers if p.exact_left]
        if exact:
            return f"{', '.join(exact)} still have exact rungs: exact levers first, across jobs"
    deficit = max(0.0, float(decision.threshold - decision.free))
    mine = _order(me)
    covered = 0.0
    cheaper = []
    for peer in sorted(peers, key=_order):
        if peer.next_lossy is None or peer.next_lossy != lossy or _order(peer) >= mine:
            continue
        cheaper.append(peer.job)
        covered = float("inf") if peer.next_freed is None else covered + peer.next_freed
        if covered >= deficit:
            return f"a cheaper move of {', '.join(cheaper)} covers the {deficit / MIB:.1f} MiB short"
    return None


def _making_room_first(me: Tenant, peers: Sequence[Tenant], arrivals: Sequence[str]) -> str | None:
    """Why to leave the room to peers still making it (``None``: none is): coordinating peers
    that have not confirmed room for every arrival and either moved for it at their last check
    (:attr:`Tenant.making_room`: the move not measured yet) or have a cheaper exact move next
    (slowdown per GiB, then name). Room for an arrival is not urgent (the newcomer waits), so one
    job moves a check and the next move is judged on what that one measured: two jobs that both
    climb on one snapshot make room twice. (A job that holds here publishes no move, so two jobs
    that moved on one snapshot both hold once, then judge afresh.)"""
    mine = _order(me)
    first = [
        p.job
        for p in peers
        if p.coordinates
        and any(job not in p.room_for for job in arrivals)
        and (p.making_room or (p.next_lossy is False and _order(p) < mine))
    ]
    if not first:
        return None
    return f"{', '.join(first)} make room first: one job at a time, each move measured before the next"


def _why_hold_release(me: Tenant, peers: Sequence[Tenant]) -> str | None:
    """Why to hold a release (``None``: no reason): a peer gives back first, the most lossy first."""

    def order(t: Tenant) -> tuple[bool, float, int, str]:
        return (not t.lossy, -t.compression, -t.rung, t.job)

    ahead = [p.job for p in peers if (p.lossy or p.rung > 0) and order(p) < order(me)]
    if ahead:
        return f"{', '.join(ahead)} give back first (one job at a time, the most lossy first)"
    return None
