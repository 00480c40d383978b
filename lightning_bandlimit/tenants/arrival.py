"""The arrival protocol: a job joins a device whose coordinating peers make room for it first.

A job's memory is unknown until its first step has run. A job that starts beside coordinating
peers announces itself (with the bytes it already holds), waits until each measured peer has
confirmed room for it, and runs its first step on its top rung (the most it can save before
anything of it is measured). Its top rung is then given back to what a run of its model on the
device measured to fit (:meth:`~lightning_bandlimit.tenants.Coordination.refit`, once).

Each job is in one :class:`Arrival` state, published in its ledger entry (the fields
``arriving``, ``held``, ``room_for`` and ``making_room`` of
:class:`~lightning_bandlimit.tenants.Tenant`). It has two parts: the job's own arrival
(:class:`Phase`) and, at each check, the room it confirmed for the peers arriving beside it
(:class:`Room`). Every change goes through :func:`advance`, by the :data:`TRANSITIONS` table:

=========================  =================  ===========  =========================================
event                      from               to           when
=========================  =================  ===========  =========================================
``ANNOUNCED``              any phase          ARRIVING     training starts beside coordinating peers
                                                           (holding ``held_bytes``)
``STARTED_UNANNOUNCED``    any phase          SETTLED      training starts with no coordinating
                                                           peer, under DDP, or publishing only
``FIRST_STEP_RAN``         ARRIVING           ON_TOP       the first step's end, or the first
                                                           check, measured the job
``REFITTED``               ON_TOP             SETTLED      the rule gave the top rung back
``LADDER_MOVED``           ON_TOP             SETTLED      a change the ladder decided itself
                                                           ended the need to refit
``MOVED_FOR_ROOM``         SETTLED, ON_TOP    (the same)   the check moved to make room: room
                                                           MAKING (the move not measured yet)
``ROOM_CONFIRMED``         SETTLED, ON_TOP    (the same)   the check confirmed room for
                                                           ``room_for``: room CONFIRMED
``NO_ROOM_CONFIRMED``      SETTLED, ON_TOP    (the same)   the check confirmed none: room
                                                           NOT_CONFIRMED
=========================  =================  ===========  =========================================

What a check confirms (:meth:`~lightning_bandlimit.tenants.Coordination.arrivals`): while a
peer arrives a job gives nothing back, and it makes room for the peer by exact rungs only: as
much as the peer's first step is estimated to need beyond what it holds (the largest peak a job
there measured on its top rung, else the largest of each job's least peak on an exact rung, a
rung more never needing more memory), with ``min_free`` kept free. The bytes its move frees are
:func:`room_to_free` (when no rung is known to free them: one rung a check, each measured before
the next); a room short by no more than the noise of the job's own peak is room. The
cheapest job first and one job at a time: a job confirms nothing while a peer still makes room
(room MAKING, or a cheaper exact move next), or while a peer's change is not in the readings
yet. Room made by a move is confirmed at the next check, once a step measured it; room found,
left to a cheaper peer's move, or with no exact rung left to give is confirmed at once, and once
confirmed is not made again for that arrival (its first step is in the readings from then on).
A job under DDP (its ranks move together) makes no room: it confirms every arrival at once.

Example:
    >>> state = advance(Arrival(), Event.ANNOUNCED, held_bytes=600)
    >>> state.phase, state.ledger_fields()["arriving"], state.ledger_fields()["held"]
    (<Phase.ARRIVING: 'arriving'>, True, 600)
    >>> advance(state, Event.FIRST_STEP_RAN).phase
    <Phase.ON_TOP: 'on top'>
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from enum import Enum
from typing import NamedTuple

__all__ = [
    "TRANSITIONS",
    "Arrival",
    "Event",
    "Phase",
    "Room",
    "Transition",
    "advance",
    "room_needed",
    "room_to_free",
]


class Phase(Enum):
    """Where a job stands in its own arrival."""

    SETTLED = "settled"  # its memory measured (or it never announced itself): nothing pending
    ARRIVING = "arriving"  # announced, holding ``held_bytes``; its first step not measured yet
    ON_TOP = "on top"  # its first step ran on its top rung; the refit to a twin's measure pending


class Room(Enum):
    """What a job's last check did for the peers arriving beside it."""

    NOT_CONFIRMED = "not confirmed"  # no arrival, its own raise, or it waits for a peer
    MAKING = "making room"  # it moved to make room; the move not measured yet
    CONFIRMED = "confirmed"  # room for ``room_for``: found, made and measured, or left to others


class Event(Enum):
    """What moves a job from one :class:`Arrival` state to the next (:data:`TRANSITIONS`)."""

    ANNOUNCED = "announced"
    STARTED_UNANNOUNCED = "started unannounced"
    FIRST_STEP_RAN = "first step ran"
    REFITTED = "refitted"
    LADDER_MOVED = "ladder moved"
    MOVED_FOR_ROOM = "moved for room"
    ROOM_CONFIRMED = "room confirmed"
    NO_ROOM_CONFIRMED = "no room confirmed"


class Transition(NamedTuple):
    """One row of :data:`TRANSITIONS`."""

    sources: frozenset[Phase]  # the phases the event may happen in
    phase: Phase | None  # the phase after it (``None``: unchanged)
    room: Room | None  # the room after it (``None``: unchanged)


_ANY = frozenset(Phase)
_CHECKING = frozenset({Phase.SETTLED, Phase.ON_TOP})  # a check runs after the first step

TRANSITIONS: dict[Event, Transition] = {
    Event.ANNOUNCED: Transition(_ANY, Phase.ARRIVING, None),
    Event.STARTED_UNANNOUNCED: Transition(_ANY, Phase.SETTLED, None),
    Event.FIRST_STEP_RAN: Transition(frozenset({Phase.ARRIVING}), Phase.ON_TOP, None),
    Event.REFITTED: Transition(frozenset({Phase.ON_TOP}), Phase.SETTLED, None),
    Event.LADDER_MOVED: Transition(frozenset({Phase.ON_TOP}), Phase.SETTLED, None),
    Event.MOVED_FOR_ROOM: Transition(_CHECKING, None, Room.MAKING),
    Event.ROOM_CONFIRMED: Transition(_CHECKING, None, Room.CONFIRMED),
    Event.NO_ROOM_CONFIRMED: Transition(_CHECKING, None, Room.NOT_CONFIRMED),
}
"""Every transition of the protocol, by event (the table of the module docstring)."""


@dataclass(frozen=True)
class Arrival:
    """A job's state in the arrival protocol (changed by :func:`advance` only).

    Attributes:
        phase: where the job stands in its own arrival.
        held_bytes: the bytes it holds while ``ARRIVING`` (``None`` in any other phase).
        room: what its last check did for the peers arriving beside it.
        room_for: the arriving jobs that check confirmed room for (only when ``CONFIRMED``).

    Raises:
        ValueError: for fields that contradict each other.
    """

    phase: Phase = Phase.SETTLED
    held_bytes: int | None = None
    room: Room = Room.NOT_CONFIRMED
    room_for: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if (self.held_bytes is not None) != (self.phase is Phase.ARRIVING):
            raise ValueError(f"held_bytes is set exactly while ARRIVING, got {self.held_bytes} {self.phase}")
        if bool(self.room_for) != (self.room is Room.CONFIRMED):
            raise ValueError(f"room_for names the jobs of a CONFIRMED room, got {self.room_for} {self.room}")

    @property
    def first_step_on_top(self) -> bool:
        """Whether the job's first step runs (or ran) on its top rung: it announced itself."""
        return self.phase is not Phase.SETTLED

    @property
    def refit_pending(self) -> bool:
        """Whether the top rung taken on arrival is still to be refitted."""
        return self.phase is Phase.ON_TOP

    def ledger_fields(self) -> dict[str, object]:
        """The state as the ledger entry carries it (:class:`~lightning_bandlimit.tenants.Tenant`'s
        ``arriving``, ``held``, ``room_for`` and ``making_room``)."""
        return {
            "arriving": self.phase is Phase.ARRIVING,
            "held": self.held_bytes,
            "room_for": self.room_for,
            "making_room": self.room is Room.MAKING,
        }


def advance(
    state: Arrival, event: Event, held_bytes: int | None = None, room_for: tuple[str, ...] = ()
) -> Arrival:
    """The state after ``event`` (by :data:`TRANSITIONS`): ``held_bytes`` goes with
    ``ANNOUNCED``, ``room_for`` with ``ROOM_CONFIRMED``.

    Raises:
        ValueError: for an event the state's phase does not have, ``ANNOUNCED`` without
            ``held_bytes`` or ``ROOM_CONFIRMED`` without ``room_for``.

    Example:
        >>> state = advance(Arrival(), Event.MOVED_FOR_ROOM)
        >>> state.room, state.ledger_fields()["making_room"]
        (<Room.MAKING: 'making room'>, True)
        >>> advance(state, Event.ROOM_CONFIRMED, room_for=("b",)).ledger_fields()["room_for"]
        ('b',)
    """
    row = TRANSITIONS[event]
    if state.phase not in row.sources:
        raise ValueError(f"no {event.value!r} transition from {state.phase.value!r}")
    if event is Event.ANNOUNCED and held_bytes is None:
        raise ValueError("a job announces itself with the bytes it holds: held_bytes is required")
    if event is Event.ROOM_CONFIRMED and not room_for:
        raise ValueError("room is confirmed for named arrivals: room_for is empty")
    if row.phase is not None:
        held = held_bytes if row.phase is Phase.ARRIVING else None
        state = replace(state, phase=row.phase, held_bytes=held)
    if row.room is not None:
        state = replace(state, room=row.room, room_for=room_for if row.room is Room.CONFIRMED else ())
    return state


def room_needed(first_step: float, held_bytes: Iterable[int | None]) -> float:
    """The bytes arrivals need beyond what they hold, each taken to need ``first_step``
    (``None``: holds nothing): ``sum(max(0, first_step - held))``.

    Example:
        >>> room_needed(3000.0, [1000, None, 3500])  # 2000 + 3000 + 0
        5000.0
    """
    return sum((max(0.0, first_step - (held or 0)) for held in held_bytes), 0.0)


def room_to_free(deficit: float, waiting: int, own_peak: float | None = None, floor: float = 0.0) -> float:
    """The bytes a job's move must free to make room for ``waiting`` arrivals, ``deficit``
    bytes short (their need and ``min_free``, less what is free).

    That is the whole ``deficit``, unless each arrival's need was sized on this job's own peak
    at its setting (``own_peak``): then a rung that frees ``x`` lowers that peak, and with it
    each waiting arrival's need, by ``x`` too, down to ``floor`` (the largest of the other jobs'
    least peaks and of what each arrival holds). Freeing ``x`` closes
    ``x + n * min(x, own_peak - floor)`` of the deficit (``n = waiting``), so the least ``x``
    that closes it is::

        max(deficit / (1 + n), deficit - n * (own_peak - floor))

    Example:
        >>> room_to_free(500.0, waiting=1)  # sized on another job's peak: all of it
        500.0
        >>> room_to_free(500.0, waiting=1, own_peak=3000.0, floor=1000.0)  # 250 freed, 250 less needed
        250.0
        >>> room_to_free(500.0, waiting=1, own_peak=3000.0, floor=2900.0)  # need falls 100 at most
        400.0
    """
    if own_peak is None:
        return deficit
    return max(deficit / (1 + waiting), deficit - waiting * (own_peak - floor))
