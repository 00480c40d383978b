"""The rung plan (recompute/plan.py): moves by bytes freed per second, grouped into rungs."""

from __future__ import annotations

import pytest

from lightning_bandlimit.recompute.plan import UnitCost, parse_move, plan_rungs, pointwise_move


def _moves(plan) -> list[str]:
    return [m for rung in plan.rungs for m in rung]


def test_moves_go_by_bytes_per_second_and_a_pointwise_move_before_its_full_one() -> None:
    costs = {
        "a": UnitCost(full=100, full_least=100, seconds=10.0, pointwise=50, pointwise_seconds=9.0),
        "b": UnitCost(full=80, full_least=80, seconds=1.0),
        "c": UnitCost(full=10, full_least=10, seconds=1.0),
    }
    plan = plan_rungs(costs, ["a", "b", "c"], max_rungs=8)
    # b (80/s) first; a's pointwise (5.6/s) before a's full rest (50/s) although dearer; c (10/s)
    assert [m for m, _, _ in plan.order] == ["b", "c", "pointwise:a", "a"]
    assert sorted(_moves(plan)) == sorted(["a", "b", "c", "pointwise:a"])
    assert sum(plan.savings) == pytest.approx(190)
    assert all(low <= high for low, high in zip(plan.least, plan.savings, strict=True))


def test_ties_keep_the_given_order_and_unknown_times_order_by_bytes() -> None:
    same = {u: UnitCost(full=10, full_least=10, seconds=1.0) for u in "xyz"}
    assert [m for m, _, _ in plan_rungs(same, ["z", "x", "y"]).order] == ["z", "x", "y"]
    untimed = {
        "x": UnitCost(full=10, full_least=10, seconds=None),
        "y": UnitCost(full=30, full_least=30, seconds=5.0),
    }
    assert [m for m, _, _ in plan_rungs(untimed, ["x", "y"]).order] == ["y", "x"]


def test_at_most_max_rungs_of_about_equal_bytes() -> None:
    costs = {f"u{i}": UnitCost(full=10, full_least=10, seconds=1.0) for i in range(12)}
    names = list(costs)
    for max_rungs in (1, 3, 4, 8, 20):
        plan = plan_rungs(costs, names, max_rungs)
        assert len(plan.rungs) <= max_rungs
        assert sorted(_moves(plan)) == sorted(names)
        assert sum(plan.savings) == pytest.approx(120)
    assert [len(r) for r in plan_rungs(costs, names, 4).rungs] == [3, 3, 3, 3]


def test_a_much_cheaper_move_gets_a_rung_of_its_own() -> None:
    costs = {
        "a": UnitCost(full=100, full_least=100, seconds=1.0, pointwise=40, pointwise_seconds=0.1),
        "b": UnitCost(full=60, full_least=60, seconds=1.0),
    }
    plan = plan_rungs(costs, ["a", "b"], max_rungs=3)
    assert plan.rungs == [["pointwise:a"], ["a"], ["b"]]
    assert plan.savings == [40.0, 60.0, 60.0]


def test_units_that_free_nothing_join_the_last_rung() -> None:
    costs = {
        "a": UnitCost(full=10, full_least=10, seconds=1.0),
        "b": UnitCost(full=0, full_least=0, seconds=1.0),
    }
    assert plan_rungs(costs, ["a", "b"], max_rungs=4).rungs == [["a", "b"]]


def test_bad_arguments() -> None:
    costs = {"a": UnitCost(full=1, full_least=1, seconds=1.0)}
    with pytest.raises(ValueError, match="max_rungs"):
        plan_rungs(costs, ["a"], max_rungs=0)
    with pytest.raises(ValueError, match="no costs"):
        plan_rungs(costs, ["a", "b"])


@pytest.mark.parametrize("name", ["layer1.0", "features[0:3]", "a:b", "pointwise"])
def test_move_names_round_trip(name: str) -> None:
    assert parse_move(pointwise_move(name)) == (name, "pointwise")
    assert parse_move(name) == (name, "full")
