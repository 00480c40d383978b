"""The rung plan (:func:`lightning_bandlimit.recompute.plan.plan_rungs`) on synthetic costs: the order
of the moves, the grouping into rungs, what each rung frees, and the move names."""

from __future__ import annotations

import random

import pytest

from lightning_bandlimit.recompute.plan import UnitCost, parse_move, plan_rungs, pointwise_move


def _order(plan) -> list[str]:
    return [name for name, _, _ in plan.order]


def _flat(plan) -> list[str]:
    return [move for rung in plan.rungs for move in rung]


def _cost(
    full: float, seconds: float | None, pointwise: float | None = None, p_seconds: float | None = None
) -> UnitCost:
    return UnitCost(full, full, seconds, pointwise, p_seconds)


# -- order ------------------------------------------------------------------------------------


def test_a_units_pointwise_move_comes_before_its_full_move_even_where_that_is_cheaper() -> None:
    # a's rest after its pointwise move frees 90 bytes in 0.5 s (180/s), its pointwise move 10 in
    # 0.5 s (20/s); b frees 50/s: b goes first, then a's pointwise move, only then a's full move
    costs = {"a": _cost(100, 1.0, 10, 0.5), "b": _cost(50, 1.0)}
    plan = plan_rungs(costs, ["a", "b"])
    assert _order(plan) == ["b", "pointwise:a", "a"]
    assert plan.order == [("b", 50, 1.0), ("pointwise:a", 10, 0.5), ("a", 90, 0.5)]


def test_moves_are_ordered_by_bytes_per_second_across_units() -> None:
    costs = {
        "u": _cost(10, 1.0),  # 10/s
        "v": _cost(30, 2.0),  # 15/s
        "w": _cost(12, 0.5),  # 24/s
        "x": _cost(100, 1.0, 60, 2.0),  # pointwise 60 bytes, said to take longer than the whole unit
    }
    plan = plan_rungs(costs, ["u", "v", "w", "x"])
    # x's pointwise seconds (2.0) exceed its forward (1.0): clamped to 1.0, so its rest costs the
    # floor 1e-9 s and follows it at once
    assert _order(plan) == ["pointwise:x", "x", "w", "v", "u"]
    assert plan.order[0] == ("pointwise:x", 60, 1.0)
    assert plan.order[1][2] == pytest.approx(1e-9)


def test_ties_fall_back_to_the_given_unit_order() -> None:
    costs = {"u": _cost(10, 1.0), "v": _cost(20, 2.0), "w": _cost(5, 0.5)}  # all 10 bytes per second
    assert _order(plan_rungs(costs, ["u", "v", "w"])) == ["u", "v", "w"]
    assert _order(plan_rungs(costs, ["w", "u", "v"])) == ["w", "u", "v"]
    # a pointwise move ties with another unit's full move: unit order again
    tied = {"a": _cost(40, 2.0, 20, 1.0), "b": _cost(20, 1.0)}
    assert _order(plan_rungs(tied, ["b", "a"])) == ["b", "pointwise:a", "a"]
    assert _order(plan_rungs(tied, ["a", "b"])) == ["pointwise:a", "a", "b"]


def test_one_unknown_time_orders_every_move_by_bytes_alone() -> None:
    # what the code does (pinned): when any unit's time is unknown every known time is ignored too:
    # each unit counts 1 s, its pointwise move half of it and its rest the other half, so moves go
    # by bytes (a pointwise move and a rest at twice their bytes), ties in unit order. (plan_rungs'
    # docstring says the moves then go in the unit order; they do not.)
    costs = {
        "x": _cost(10, None),
        "y": _cost(30, 100.0),  # slow, but bytes alone count
        "z": _cost(20, 0.001),  # fast, likewise
        "p": _cost(24, 0.001, 12, 0.0005),  # pointwise 12 and rest 12, each over 0.5 s: 24/s
        "t": _cost(20, None),  # ties with z: unit order
    }
    plan = plan_rungs(costs, ["x", "y", "z", "p", "t"])
    assert _order(plan) == ["y", "pointwise:p", "p", "z", "t", "x"]
    assert [seconds for _, _, seconds in plan.order] == [1.0, 0.5, 0.5, 1.0, 1.0, 1.0]
    # with every time known, the same units go by bytes per second
    timed = dict(costs, x=_cost(10, 1.0), t=_cost(20, 1.0))
    assert _order(plan_rungs(timed, ["x", "y", "z", "p", "t"]))[:3] == ["pointwise:p", "p", "z"]


def test_a_pointwise_move_that_frees_nothing_is_no_move() -> None:
    costs = {"a": _cost(50, 1.0, 0, 0.1), "b": _cost(50, 1.0, None, 0.1)}
    plan = plan_rungs(costs, ["a", "b"])
    assert _order(plan) == ["a", "b"] and plan.order[0] == ("a", 50, 1.0)


# -- grouping ---------------------------------------------------------------------------------


def _random_costs(seed: int, n: int = 15) -> dict[str, UnitCost]:
    rng = random.Random(seed)
    costs = {}
    for i in range(n):
        full = rng.choice([0, rng.randint(1, 1000)]) if i % 7 == 6 else rng.randint(1, 1000)
        least = rng.randint(0, full)
        seconds = rng.uniform(0.01, 2.0)
        pointwise = p_seconds = None
        if rng.random() < 0.6 and full > 0:
            pointwise = rng.randint(1, full)
            p_seconds = rng.uniform(0.0, seconds)
        costs[f"block{i}.{rng.randint(0, 9)}"] = UnitCost(full, least, seconds, pointwise, p_seconds)
    return costs


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("max_rungs", [1, 2, 3, 5, 8, 40])
def test_every_move_once_at_most_max_rungs_and_the_bytes_add_up(seed: int, max_rungs: int) -> None:
    costs = _random_costs(seed)
    units = list(costs)
    plan = plan_rungs(costs, units, max_rungs)
    moves = _flat(plan)
    expected = units + [pointwise_move(u) for u in units if (costs[u].pointwise or 0) > 0]
    assert sorted(moves) == sorted(expected) and len(moves) == len(set(moves))
    assert moves == _order(plan)  # the rungs cut the order, they do not reorder it
    assert 1 <= len(plan.rungs) <= max_rungs and all(plan.rungs)
    assert len(plan.savings) == len(plan.least) == len(plan.rungs)
    for u in units:
        if pointwise_move(u) in moves:
            assert moves.index(pointwise_move(u)) < moves.index(u)
    assert sum(plan.savings) == pytest.approx(sum(c.full for c in costs.values()))
    assert sum(plan.least) == pytest.approx(sum(c.full_least for c in costs.values()))
    bytes_of = {name: freed for name, freed, _ in plan.order}
    for rung, saving, least in zip(plan.rungs, plan.savings, plan.least, strict=True):
        assert saving == pytest.approx(sum(bytes_of[m] for m in rung))
        assert least <= saving + 1e-9
    assert all(s >= 0 for s in plan.savings)


def test_rungs_of_about_equal_bytes_where_every_move_costs_the_same_per_byte() -> None:
    sizes = [7, 3, 9, 4, 6, 2, 8, 5, 1, 10]
    costs = {f"u{i}": _cost(b, b * 0.125) for i, b in enumerate(sizes)}  # all 8 bytes per second
    units = list(costs)
    for max_rungs in (2, 3, 4, 6):
        plan = plan_rungs(costs, units, max_rungs)
        target = sum(sizes) / max_rungs
        assert _flat(plan) == units  # equal rates: the given order
        for rung, saving in zip(plan.rungs[:-1], plan.savings[:-1], strict=True):
            # a rung is closed on the move that brings it to its share, not before, not after
            assert saving >= target
            assert saving - costs[rung[-1]].full < target
        assert len(plan.rungs) <= max_rungs
    # a rung that reaches its share exactly is closed there
    same = {f"v{i}": _cost(10, 1.0) for i in range(12)}
    assert [len(r) for r in plan_rungs(same, list(same), 4).rungs] == [3, 3, 3, 3]
    assert [len(r) for r in plan_rungs(same, list(same), 5).rungs] == [3, 3, 3, 3]  # 24 each: 30 by 3


def test_max_rungs_one_puts_every_move_in_one_rung() -> None:
    costs = {"a": _cost(100, 1.0, 90, 0.01), "b": _cost(1, 50.0)}
    plan = plan_rungs(costs, ["a", "b"], max_rungs=1)
    assert plan.rungs == [["pointwise:a", "a", "b"]] and plan.savings == [101.0]


def test_a_cheap_pointwise_move_gets_a_rung_of_its_own_where_the_next_bytes_cost_over_twice_as_much() -> None:
    # b: 100 bytes in 100 s comes last; total 180, two rungs: a share of 90 each
    b = _cost(100, 100.0)
    # a's pointwise 40 bytes in 0.125 s (320/s); its rest 39 in 0.25 s (156/s): over twice as dear
    dear = plan_rungs({"a": _cost(79, 0.375, 40, 0.125), "b": b}, ["a", "b"], max_rungs=2)
    assert dear.rungs == [["pointwise:a"], ["a", "b"]]
    assert dear.savings == [40, 139]
    # its rest 40 in 0.25 s (160/s): exactly twice as dear joins the rung
    even = plan_rungs({"a": _cost(80, 0.375, 40, 0.125), "b": b}, ["a", "b"], max_rungs=2)
    assert even.rungs == [["pointwise:a", "a"], ["b"]]  # b (1/s) is far dearer than the rung
    assert even.savings == [80, 100]


def test_a_dearer_move_starts_no_rung_past_max_rungs() -> None:
    costs = {"a": _cost(100, 1.0, 10, 0.001), "b": _cost(10, 10.0), "c": _cost(1, 100.0)}
    assert plan_rungs(costs, ["a", "b", "c"], max_rungs=2).rungs == [["pointwise:a"], ["a", "b", "c"]]
    assert plan_rungs(costs, ["a", "b", "c"], max_rungs=4).rungs == [["pointwise:a"], ["a"], ["b"], ["c"]]


def test_units_that_free_nothing_join_the_last_rung() -> None:
    costs = {
        "z": _cost(0, 0.001),  # nothing at no cost: still ordered last (0 bytes per second)
        "a": _cost(60, 1.0),
        "b": _cost(60, 1.0),
        "n": _cost(-5, 1.0),  # a negative measurement frees nothing
    }
    plan = plan_rungs(costs, ["z", "a", "b", "n"], max_rungs=4)
    assert plan.rungs == [["a"], ["b", "z", "n"]]
    assert plan.savings == [60.0, 60.0]
    # a unit whose pointwise move frees all it frees: its full move (0 bytes more) goes last
    plan = plan_rungs({"p": _cost(50, 1.0, 50, 0.5), "a": _cost(50, 1.0)}, ["p", "a"], max_rungs=4)
    assert plan.rungs == [["pointwise:p"], ["a", "p"]]


def test_units_not_named_are_left_out() -> None:
    costs = {"a": _cost(10, 1.0), "b": _cost(20, 1.0), "c": _cost(30, 1.0)}
    plan = plan_rungs(costs, ["c", "a"])
    assert sorted(_flat(plan)) == ["a", "c"] and sum(plan.savings) == 40


def test_bad_arguments_raise() -> None:
    costs = {"a": _cost(1, 1.0)}
    for bad in (0, -3):
        with pytest.raises(ValueError, match="max_rungs must be at least 1"):
            plan_rungs(costs, ["a"], max_rungs=bad)
    with pytest.raises(ValueError, match=r"no costs for units \['b', 'c'\]"):
        plan_rungs(costs, ["a", "b", "c"])


def test_no_units_no_rungs() -> None:
    plan = plan_rungs({}, [])
    assert plan.rungs == [] and plan.savings == [] and plan.order == []


# -- move names -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "unit",
    ["3", "layer1.0", "features[0:3]", "model.features[16:21]", "a:b", "pointwise", "x.pointwise:y"],
)
def test_move_names_round_trip(unit: str) -> None:
    move = pointwise_move(unit)
    assert move == "pointwise:" + unit
    assert parse_move(move) == (unit, "pointwise")
    assert parse_move(unit) == (unit, "full")
    assert parse_move(pointwise_move(move)) == (move, "pointwise")  # only the first prefix is the mode


def test_a_plan_over_segment_names_parses_back_to_its_units() -> None:
    units = ["features[0:3]", "features[3:6]", "features[6:11]"]
    costs = {u: _cost(100 - 10 * i, 1.0, 30, 0.1) for i, u in enumerate(units)}
    plan = plan_rungs(costs, units, max_rungs=3)
    parsed = [parse_move(m) for m in _flat(plan)]
    assert sorted(parsed) == sorted([(u, m) for u in units for m in ("pointwise", "full")])
