"""The arrival protocol's state machine (``tenants.arrival``): one test per transition, driven
through ``advance`` directly, and the room a job's move frees (``room_to_free``)."""

from __future__ import annotations

import pytest

from lightning_bandlimit.ladder import Decision, LadderController, Setting
from lightning_bandlimit.tenants import Coordination, Tenant
from lightning_bandlimit.tenants.arrival import (
    TRANSITIONS,
    Arrival,
    Event,
    Phase,
    Room,
    advance,
    room_needed,
    room_to_free,
)

SETTLED = Arrival()
ARRIVING = Arrival(Phase.ARRIVING, held_bytes=600)
ON_TOP = Arrival(Phase.ON_TOP)
CONFIRMED = Arrival(room=Room.CONFIRMED, room_for=("b",))


def _invalid(event: Event, *states: Arrival, **payload: object) -> None:
    for state in states:
        with pytest.raises(ValueError, match="transition"):
            advance(state, event, **payload)  # type: ignore[arg-type]


def test_every_event_has_one_row_and_the_checks_run_after_the_first_step() -> None:
    assert set(TRANSITIONS) == set(Event)
    for event in (Event.MOVED_FOR_ROOM, Event.ROOM_CONFIRMED, Event.NO_ROOM_CONFIRMED):
        assert Phase.ARRIVING not in TRANSITIONS[event].sources


def test_announced_makes_the_job_arriving_with_the_bytes_it_holds() -> None:
    for state in (SETTLED, ON_TOP, CONFIRMED):
        arriving = advance(state, Event.ANNOUNCED, held_bytes=600)
        assert arriving.phase is Phase.ARRIVING and arriving.held_bytes == 600
        assert arriving.room == state.room and arriving.room_for == state.room_for  # the room stays
        assert arriving.first_step_on_top and not arriving.refit_pending
    assert advance(SETTLED, Event.ANNOUNCED, held_bytes=600).ledger_fields() == {
        "arriving": True,
        "held": 600,
        "room_for": (),
        "making_room": False,
    }
    with pytest.raises(ValueError, match="held_bytes"):
        advance(SETTLED, Event.ANNOUNCED)


def test_started_unannounced_settles_the_job_with_nothing_held_nor_to_refit() -> None:
    for state in (SETTLED, ARRIVING, ON_TOP, CONFIRMED):
        alone = advance(state, Event.STARTED_UNANNOUNCED)
        assert alone.phase is Phase.SETTLED and alone.held_bytes is None
        assert not alone.first_step_on_top and not alone.refit_pending
        assert alone.room_for == state.room_for


def test_first_step_ran_puts_an_arrival_on_its_top_rung_with_the_refit_pending() -> None:
    on_top = advance(ARRIVING, Event.FIRST_STEP_RAN)
    assert on_top == ON_TOP and on_top.refit_pending and on_top.first_step_on_top
    assert on_top.ledger_fields()["arriving"] is False and on_top.ledger_fields()["held"] is None
    _invalid(Event.FIRST_STEP_RAN, SETTLED, ON_TOP)


def test_refitted_settles_a_job_on_its_top_rung() -> None:
    assert advance(ON_TOP, Event.REFITTED) == SETTLED
    _invalid(Event.REFITTED, SETTLED, ARRIVING)


def test_a_change_the_ladder_decided_ends_the_need_to_refit() -> None:
    assert advance(ON_TOP, Event.LADDER_MOVED) == SETTLED
    _invalid(Event.LADDER_MOVED, SETTLED, ARRIVING)


def test_moved_for_room_publishes_making_room_and_confirms_nothing() -> None:
    for state in (SETTLED, ON_TOP, CONFIRMED):
        making = advance(state, Event.MOVED_FOR_ROOM)
        assert making.room is Room.MAKING and making.phase is state.phase
        assert making.ledger_fields()["making_room"] is True and making.ledger_fields()["room_for"] == ()
    _invalid(Event.MOVED_FOR_ROOM, ARRIVING)


def test_room_confirmed_names_the_arrivals_and_ends_making_room() -> None:
    making = advance(SETTLED, Event.MOVED_FOR_ROOM)
    confirmed = advance(making, Event.ROOM_CONFIRMED, room_for=("b", "c"))
    assert confirmed.room is Room.CONFIRMED and confirmed.room_for == ("b", "c")
    assert confirmed.ledger_fields()["making_room"] is False
    assert advance(ON_TOP, Event.ROOM_CONFIRMED, room_for=("b",)).phase is Phase.ON_TOP
    with pytest.raises(ValueError, match="room_for"):
        advance(SETTLED, Event.ROOM_CONFIRMED)
    _invalid(Event.ROOM_CONFIRMED, ARRIVING, room_for=("b",))


def test_no_room_confirmed_clears_the_room() -> None:
    for state in (CONFIRMED, advance(SETTLED, Event.MOVED_FOR_ROOM)):
        cleared = advance(state, Event.NO_ROOM_CONFIRMED, room_for=("ignored",))
        assert cleared == SETTLED and cleared.ledger_fields()["room_for"] == ()
    _invalid(Event.NO_ROOM_CONFIRMED, ARRIVING)


def test_a_state_that_contradicts_itself_is_refused() -> None:
    for fields in (
        {"phase": Phase.ARRIVING},  # arriving, holding nothing known
        {"held_bytes": 5},  # settled, holding
        {"room": Room.CONFIRMED},  # confirmed for nobody
        {"room_for": ("b",)},  # named, not confirmed
    ):
        with pytest.raises(ValueError):
            Arrival(**fields)  # type: ignore[arg-type]


def test_room_needed_is_each_arrivals_need_beyond_what_it_holds() -> None:
    assert room_needed(3000.0, [1000, None, 3500]) == 5000.0  # 2000 + 3000 + 0
    assert room_needed(3000.0, []) == 0.0


def test_room_to_free_on_a_worked_example() -> None:
    # 500 short; one arrival sized on this job's own peak of 3000, holding 1000: a rung that
    # frees x lowers the arrival's need by x too, down to 1000, so x = max(500 / 2, 500 - 2000)
    assert room_to_free(500.0, 1, own_peak=3000.0, floor=1000.0) == 250.0
    # a peer's least of 2900 bounds the fall at 100: x = max(250, 500 - 100)
    assert room_to_free(500.0, 1, own_peak=3000.0, floor=2900.0) == 400.0
    # two arrivals: x closes x + 2 x, so a third; bounded by 50 each: 600 - 100
    assert room_to_free(600.0, 2, own_peak=3000.0, floor=1000.0) == 200.0
    assert room_to_free(600.0, 2, own_peak=3000.0, floor=2950.0) == 500.0
    assert room_to_free(500.0, 1) == 500.0  # sized on another job's peak: all of it


def test_the_rule_makes_the_room_room_to_free_names() -> None:
    # rungs of 150 each: 250 to free is rung 2 (300), 400 is rung 3 (450), as room_to_free says
    ladder = LadderController(rungs=4, min_free=200, release_free=400)
    ladder.on_stages_measured([150.0] * 4)
    ladder.observe(Setting(0, 0.0), 3000)
    newcomer = Tenant("b", 1, 0.0, arriving=True, held=1000)
    calm = Decision(0, 0.0, "hold", free=1700, threshold=200)  # 2000 + 200 wanted: 500 short
    me = Tenant("a", 1, 0.0)
    moved, room, _ = Coordination().arrivals(calm, Setting(0, 0.0), me, [newcomer], 0.0, ladder)
    assert moved.setting == Setting(2, 0.0) and room == ()
    peer = Tenant("c", 1, 0.0, rung_peaks=((0, 2900),))
    moved, room, _ = Coordination().arrivals(calm, Setting(0, 0.0), me, [peer, newcomer], 0.0, ladder)
    assert moved.setting == Setting(3, 0.0) and room == ()
