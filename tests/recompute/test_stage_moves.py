"""Rungs of moves (:class:`lightning_bandlimit.recompute.rungs.CheckpointRungs` with pointwise and
full moves) and the profile that plans them (:class:`~lightning_bandlimit.recompute.profile.UnitProfile`):
modes per rung, read back, removed; what a unit's pointwise mode frees, measured; the plan exact."""

from __future__ import annotations

import copy

import pytest
import torch
from recompute_cases import BLOCKS
from torch import nn

from lightning_bandlimit.models import cifar_resnet18
from lightning_bandlimit.recompute.plan import parse_move
from lightning_bandlimit.recompute.profile import UnitProfile
from lightning_bandlimit.recompute.rungs import CheckpointRungs
from lightning_bandlimit.recompute.saved_tensors import SavedTensorMeter
from lightning_bandlimit.recompute.switch import checkpoint, checkpoint_mode, uncheckpoint
from lightning_bandlimit.recompute.unit_choice import checkpoint_units

pytestmark = pytest.mark.usefixtures("one_thread")

MOVES = [["pointwise:3", "pointwise:4"], ["3"], ["4", "5"]]
# the mode of each unit at each rung of MOVES (a unit not named runs plainly)
EXPECTED = [
    {},
    {"3": "pointwise", "4": "pointwise"},
    {"3": "full", "4": "pointwise"},
    {"3": "full", "4": "full", "5": "full"},
]


def _modes(stages: CheckpointRungs) -> dict[str, str]:
    return {n: m for n, u in stages.units.items() if (m := checkpoint_mode(u)) is not None}


def _stages(moves: list[list[str]] = MOVES) -> tuple[nn.Module, CheckpointRungs]:
    model = cifar_resnet18(width=4)
    stages = CheckpointRungs(checkpoint_units(model))
    stages.set_stages(moves)
    return model, stages


# -- rungs of moves ---------------------------------------------------------------------------


def test_apply_sets_each_units_mode_as_modes_at_says_and_rung_reads_it_back() -> None:
    _, stages = _stages()
    assert [stages.modes_at(r) for r in range(4)] == EXPECTED
    assert [stages.units_at(r) for r in range(4)] == [0, 2, 2, 3]
    for r in (0, 1, 2, 3, 2, 0, 3, 1, 0):  # up and down, skipping rungs
        stages.apply(r)
        assert _modes(stages) == EXPECTED[r], r
        assert stages.rung == r
        assert stages.checkpointed() == sorted(EXPECTED[r], key=BLOCKS.index)
    stages.release()
    assert stages.checkpointed() == [] and stages.rung == 0


def test_full_wins_over_pointwise_whichever_rung_names_it_first() -> None:
    _, stages = _stages([["3"], ["pointwise:3", "pointwise:4"]])
    assert stages.modes_at(2) == {"3": "full", "4": "pointwise"}
    stages.apply(2)
    assert checkpoint_mode(stages.units["3"]) == "full"
    assert stages.rung == 2
    stages.apply(1)
    # rung 1 makes rung 2's pointwise move on 3 already (full is more): rung 2 is not reached
    # until 4 is pointwise too
    assert stages.rung == 1 and _modes(stages) == {"3": "full"}


def test_rung_reads_the_units_not_a_stored_number() -> None:
    _, stages = _stages()
    stages.apply(3)
    uncheckpoint(stages.units["4"])  # someone switched 4 off: rungs 1 and up are not made
    assert stages.rung == 0
    checkpoint(stages.units["4"], "4", mode="pointwise")
    assert stages.rung == 2  # rung 3 wants 4 in full
    assert stages.units_at(3) == 3


def test_apply_checks_its_rung_and_set_stages_its_units() -> None:
    model = cifar_resnet18(width=4)
    stages = CheckpointRungs(checkpoint_units(model))
    assert stages.rung == 0 and stages.units_at(3) == 0 and stages.modes_at(2) == {}
    with pytest.raises(RuntimeError, match="before set_stages"):
        stages.apply(1)
    for bad in ([["pointwise:99"]], [["3"], ["99"]], [["pointwise:"]]):
        with pytest.raises(ValueError, match="unknown units"):
            stages.set_stages(bad)
    assert stages.stages is None  # a refused plan leaves none
    stages.set_stages(MOVES)
    for bad in (-1, 4):
        with pytest.raises(ValueError, match=r"rung must be in \[0, 3\]"):
            stages.apply(bad)


def test_remove_pointwise_only_drops_the_pointwise_move_and_keeps_the_unit() -> None:
    _, stages = _stages()
    stages.apply(1)  # 3 and 4 pointwise
    stages.remove(["3"], pointwise_only=True)
    assert stages.stages == [["pointwise:4"], ["3"], ["4", "5"]]
    assert "3" in stages.units
    # re-applied at the rung the units still make: 3 was pointwise, which no rung asks now
    assert stages.rung == 1 and _modes(stages) == {"4": "pointwise"}
    assert [stages.modes_at(r) for r in range(4)] == [
        {},
        {"4": "pointwise"},
        {"4": "pointwise", "3": "full"},
        {"4": "full", "3": "full", "5": "full"},
    ]
    stages.apply(2)
    assert _modes(stages) == {"3": "full", "4": "pointwise"}
    # a rung emptied by the removal goes
    _, stages = _stages([["pointwise:3"], ["3", "4"]])
    stages.apply(2)
    stages.remove(["3"], pointwise_only=True)
    assert stages.stages == [["3", "4"]]
    assert stages.rung == 1 and _modes(stages) == {"3": "full", "4": "full"}


def test_remove_drops_the_unit_from_every_rung_and_gives_it_its_class_back() -> None:
    model, stages = _stages()
    block = stages.units["3"]
    stages.apply(3)
    stages.remove(["3"])
    assert "3" not in stages.units and type(block).__name__ == "_BasicBlock"
    assert stages.stages == [["pointwise:4"], ["4", "5"]]
    assert stages.checkpointed() == ["4", "5"]  # the others are left as they were
    stages.apply(1)
    assert _modes(stages) == {"4": "pointwise"} and checkpoint_mode(block) is None
    with pytest.raises(ValueError, match="unknown units"):
        stages.set_stages(MOVES)  # 3 is gone
    with pytest.raises(ValueError, match="unknown units"):
        stages.remove(["3"])
    assert model.get_submodule("3") is block


def test_each_rung_of_moves_keeps_less_and_gives_the_same_gradients() -> None:
    torch.manual_seed(0)
    model, stages = _stages()
    model = model.double().train()
    state = copy.deepcopy(model.state_dict())
    x = torch.rand(4, 3, 32, 32, dtype=torch.float64)
    kept, grads = [], []
    for r in range(4):
        stages.apply(r)
        model.load_state_dict(state)
        model.zero_grad(set_to_none=True)
        with SavedTensorMeter(exclude=model.parameters()) as meter:
            out = model(x)
        out.square().sum().backward()
        kept.append(meter.bytes)
        grads.append([p.grad.clone() for p in model.parameters()])
    assert kept[0] > kept[1] > kept[2] > kept[3]
    for r in range(1, 4):
        for a, b in zip(grads[0], grads[r], strict=True):
            torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    stages.release()


# -- the profile and its plan -----------------------------------------------------------------


@pytest.fixture(scope="module")
def profiled() -> dict:
    """cifar_resnet18(width=4) in float64, batch 8: one plain training forward profiled."""
    torch.manual_seed(0)
    model = cifar_resnet18(width=4).double().train()
    units = checkpoint_units(model)
    state = copy.deepcopy(model.state_dict())
    x = torch.rand(8, 3, 32, 32, dtype=torch.float64)
    with UnitProfile(units, exclude=model.parameters()) as profile:
        out = model(x)
    out.sum().backward()
    model.load_state_dict(state)
    model.zero_grad(set_to_none=True)
    return {"model": model, "units": units, "profile": profile, "x": x, "state": state}


def _whole_model_bytes(model: nn.Module, x: torch.Tensor) -> int:
    with SavedTensorMeter(exclude=model.parameters()) as meter:
        out = model(x)
    out.sum().backward()
    model.zero_grad(set_to_none=True)
    return meter.bytes


def test_the_profile_records_times_layers_and_outputs(profiled: dict) -> None:
    profile = profiled["profile"]
    assert profile.order == BLOCKS
    for name in BLOCKS:
        assert profile.seconds[name] > 0 and 0 < profile.layer_seconds[name] <= profile.seconds[name]
        channels, height, width = profile.shapes[name]
        assert profile.output_bytes[name] == 8 * channels * height * width * 8
    # the layers' outputs: two 3x3 convolutions, and a 1x1 shortcut in the downsampling blocks
    for name in BLOCKS:
        convs = 3 if name in ("5", "7", "9") else 2
        assert profile.layer_bytes[name] == convs * profile.output_bytes[name]


def test_pointwise_savings_are_at_most_unit_savings(profiled: dict) -> None:
    profile = profiled["profile"]
    pointwise, full = profile.pointwise_savings(), profile.unit_savings()
    assert set(pointwise) == set(full) == set(BLOCKS)
    for name in BLOCKS:
        assert 0 < pointwise[name] <= full[name], name
        # what is left: ReLU1's output (one output's bytes) and the BatchNorms' statistics
        bns = 3 if name in ("5", "7", "9") else 2
        channels = profile.shapes[name][0]
        assert pointwise[name] == profile.output_bytes[name] + bns * 4 * channels * 8, name


@pytest.mark.parametrize("name", BLOCKS[:-1])
def test_switching_one_interior_unit_to_pointwise_frees_exactly_its_pointwise_savings(
    profiled: dict, name: str
) -> None:
    model, x = profiled["model"], profiled["x"]
    unit = dict(profiled["units"])[name]
    plain = _whole_model_bytes(model, x)
    checkpoint(unit, name, mode="pointwise")
    try:
        pointwise = _whole_model_bytes(model, x)
    finally:
        uncheckpoint(unit)
    assert plain - pointwise == profiled["profile"].pointwise_savings()[name]


def test_the_last_unit_frees_its_output_too_which_the_pooling_after_it_does_not_keep(profiled: dict) -> None:
    # pinned: pointwise_savings leaves out each unit's output as kept by what follows; after the
    # last block comes the global average pool, which keeps no input, so that unit frees more
    model, x = profiled["model"], profiled["x"]
    profile = profiled["profile"]
    unit = dict(profiled["units"])["10"]
    plain = _whole_model_bytes(model, x)
    checkpoint(unit, "10", mode="pointwise")
    try:
        pointwise = _whole_model_bytes(model, x)
    finally:
        uncheckpoint(unit)
    assert plain - pointwise == profile.pointwise_savings()["10"] + profile.output_bytes["10"]


def test_the_plan_covers_every_unit_and_its_top_rung_is_all_full(profiled: dict) -> None:
    model, units, profile = profiled["model"], profiled["units"], profiled["profile"]
    plan = profile.plan()
    moves = [m for rung in plan.rungs for m in rung]
    full_moves = [m for m in moves if parse_move(m)[1] == "full"]
    assert sorted(full_moves) == sorted(BLOCKS)  # every unit's full move, once
    assert sorted(m for m in moves if m not in full_moves) == sorted(f"pointwise:{u}" for u in BLOCKS)
    assert 1 <= len(plan.rungs) <= 8 and all(plan.rungs)
    assert sum(plan.savings) == pytest.approx(sum(profile.unit_savings().values()))
    assert len(profile.plan(max_rungs=3).rungs) <= 3
    assert all(parse_move(m)[1] == "full" for r in profile.plan(pointwise=False).rungs for m in r)
    no_pw = profile.plan(no_pointwise=["3", "4"])
    assert not {"pointwise:3", "pointwise:4"} & {m for r in no_pw.rungs for m in r}
    stages = CheckpointRungs(units)
    stages.set_stages(plan.rungs)
    top = len(plan.rungs)
    stages.apply(top)
    assert {n: checkpoint_mode(u) for n, u in units} == dict.fromkeys(BLOCKS, "full")
    assert stages.rung == top and stages.units_at(top) == 8
    stages.release()
    assert all(checkpoint_mode(u) is None for _, u in units) and type(model[3]).__name__ == "_BasicBlock"


def test_every_rung_of_the_plan_gives_rung_zeros_gradients(profiled: dict) -> None:
    model, units, x = profiled["model"], profiled["units"], profiled["x"]
    plan = profiled["profile"].plan()
    stages = CheckpointRungs(units)
    stages.set_stages(plan.rungs)
    grads, kept = [], []
    try:
        for r in range(len(plan.rungs) + 1):
            stages.apply(r)
            assert stages.rung == r
            model.load_state_dict(profiled["state"])
            model.zero_grad(set_to_none=True)
            with SavedTensorMeter(exclude=model.parameters()) as meter:
                out = model(x)
            torch.nn.functional.cross_entropy(out, torch.arange(8) % 10).backward()
            grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
            kept.append(meter.bytes)
    finally:
        stages.release()
        model.load_state_dict(profiled["state"])
        model.zero_grad(set_to_none=True)
    assert all(a > b for a, b in zip(kept, kept[1:], strict=False))  # each rung keeps less
    for r, rung in enumerate(grads[1:], start=1):
        for name, grad in grads[0].items():
            torch.testing.assert_close(rung[name], grad, rtol=1e-12, atol=1e-12, msg=f"rung {r}: {name}")
