"""Room for an arrival: what a settled job's check does while a peer arrives beside it.

While a peer arrives (``Tenant.arriving``: its first step, which measures it, not run yet), a
job gives nothing back and makes room for it by exact rungs only (:func:`room_for_arrivals`):
as much as the newcomer's first step is taken to need (the largest peak a job here measured on
its top rung, else the largest of each job's least peak on an exact rung, else the largest
memory measured here), less what it holds already, with ``min_free`` kept free. One job at a
time, the cheapest first: a job leaves the room to a peer whose cheaper move covers it, or that
still makes room; a job whose peer changed within ``dwell`` seconds confirms nothing. The
protocol's states, events and the bytes a move must free are in
:mod:`lightning_bandlimit.tenants.arrival` (one table).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from lightning_bandlimit.ladder.controller import LadderController
from lightning_bandlimit.ladder.reasons import HOLD, LOWER, RAISE
from lightning_bandlimit.ladder.setting import Decision, Setting
from lightning_bandlimit.tenants.arrival import room_needed, room_to_free
from lightning_bandlimit.tenants.ledger import Tenant
from lightning_bandlimit.tenants.offer import top_memory
from lightning_bandlimit.tenants.order import changed_within, move_order, same_memory, why_hold_raise
from lightning_bandlimit.utils.units import MIB

__all__ = ["room_for_arrivals"]


def room_for_arrivals(
    decision: Decision,
    current: Setting,
    me: Tenant,
    peers: Sequence[Tenant],
    at: float,
    controller: LadderController,
    dwell: float = 0.0,
) -> tuple[Decision, tuple[str, ...], str | None]:
    """``decision`` while peers arrive (``Tenant.arriving``), the arrivals this check confirms
    room for (found free, left to a cheaper peer's move, or nothing exact left to give; room
    made by a move is confirmed at the next check, once a step at the new setting measured it),
    and why it changed (``None``: not changed); ``at``: the time of the check, ``dwell``: the
    seconds after a peer's change during which nothing is confirmed. A raise of the job's own
    goes through :meth:`~lightning_bandlimit.tenants.coordination.Coordination.decide` instead
    (returned unchanged, no room confirmed).

    Example:
        >>> ladder = LadderController(rungs=2, min_free=100)
        >>> ladder.on_stages_measured([300.0, 100.0]); ladder.observe(Setting(0, 0.0), 1000)
        >>> me = Tenant("a", 1, 0.0, memory=1000)
        >>> newcomer = Tenant("b", 2, 0.0, arriving=True, held=600)  # 400 more like a's
        >>> calm = Decision(0, 0.0, "hold", free=350, threshold=100)  # 150 short of that
        >>> decision, room_for, why = room_for_arrivals(calm, Setting(0, 0.0), me, [newcomer], 1.0, ladder)
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
    if (recent := changed_within(peers, at, dwell)) is not None:  # not in the readings: nothing confirmed
        return kept, (), recent
    settled = [p for p in peers if not p.arriving]
    short = Decision.at(current, RAISE, decision.free, int(low + need))
    cheaper = why_hold_raise(short, me, settled)
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
    nothing is measured here (no peer's memory, none of this job's).

    Example:
        >>> ladder = LadderController(rungs=2, min_free=100)
        >>> peer = Tenant("a", 1, 0.0, memory=900, top_memory=700)
        >>> _first_step_estimate([peer], Setting(0, 0.0), ladder)[:2]
        (700.0, ' on its top rung')
    """
    settled = [p for p in peers if not p.arriving]
    known = [float(p.memory) for p in settled if p.memory is not None]
    known += [*controller.rung_memory.points.values(), *controller.compression_memory.points.values()]
    if not known:
        return None
    tops = [float(p.top_memory) for p in settled if p.top_memory is not None]
    mine = top_memory(controller)
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


def _making_room_first(me: Tenant, peers: Sequence[Tenant], arrivals: Sequence[str]) -> str | None:
    """Why to leave the room to peers still making it (``None``: none is): coordinating peers
    that have not confirmed room for every arrival and either moved for it at their last check
    (:attr:`Tenant.making_room`: the move not measured yet) or have a cheaper exact move next
    (:func:`~lightning_bandlimit.tenants.order.move_order`). Room for an arrival is not urgent
    (the newcomer waits), so one job moves a check and the next move is judged on what that one
    measured: two jobs that both climb on one snapshot make room twice. (A job that holds here
    publishes no move, so two jobs that moved on one snapshot both hold once, then judge afresh.)"""
    mine = move_order(me)
    first = [
        p.job
        for p in peers
        if p.coordinates
        and any(job not in p.room_for for job in arrivals)
        and (p.making_room or (p.next_lossy is False and move_order(p) < mine))
    ]
    if not first:
        return None
    return f"{', '.join(first)} make room first: one job at a time, each move measured before the next"


def _nothing_given_back(decision: Decision, current: Setting, me: Tenant) -> Decision:
    """``decision``, but a release held while a peer arrives (a rung that frees nothing, down
    from one measured idle, is not giving: it goes through)."""
    if decision.reason == LOWER and not same_memory(decision, me):
        return Decision.at(current, HOLD, decision.free, decision.threshold)
    return decision


def _least_peak(peer: Tenant) -> float:
    """A peer's least peak on an exact rung (its memory where it measured none)."""
    return float(min(b for _, b in peer.rung_peaks) if peer.rung_peaks else peer.memory)  # type: ignore[arg-type]
