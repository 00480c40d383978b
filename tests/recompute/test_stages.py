"""The units a model checkpoints (:mod:`lightning_bandlimit.recompute.unit_choice`), their profile
(:mod:`lightning_bandlimit.recompute.profile`) and the rungs that checkpoint them, by stage
(:mod:`lightning_bandlimit.recompute.rungs`)."""

import copy

import pytest
import torch
import torchvision
from recompute_cases import BLOCKS, _assert_same_step, _batch, _checkpoint_all, _saved_bytes, _step
from torch import nn

from lightning_bandlimit.models import cifar_resnet18, small_cnn
from lightning_bandlimit.models.backbones import _BasicBlock
from lightning_bandlimit.recompute.profile import UnitProfile
from lightning_bandlimit.recompute.rungs import CheckpointRungs
from lightning_bandlimit.recompute.switch import checkpoint, is_checkpointed
from lightning_bandlimit.recompute.unit_choice import checkpoint_units

pytestmark = pytest.mark.usefixtures("one_thread")


# -- which units ------------------------------------------------------------------------------


def test_checkpoint_units_finds_the_residual_blocks() -> None:
    model = cifar_resnet18(width=4)
    units = checkpoint_units(model)
    assert [n for n, _ in units] == BLOCKS
    assert all(type(m).__name__ == "_BasicBlock" for _, m in units)
    assert all(m is model.get_submodule(n) for n, m in units)
    assert checkpoint_units(small_cnn(width=4)) == []  # a plain chain has none
    assert checkpoint_units(nn.Conv2d(3, 3, 3)) == []


def test_checkpoint_units_of_torchvision_resnet18() -> None:
    model = torchvision.models.resnet18(weights=None)
    units = checkpoint_units(model)
    assert [n for n, _ in units] == [f"layer{i}.{j}" for i in (1, 2, 3, 4) for j in (0, 1)]
    assert {type(m).__name__ for _, m in units} == {"BasicBlock"}


def test_checkpoint_units_are_found_while_checkpointed() -> None:
    model = cifar_resnet18(width=4)
    _checkpoint_all(model)
    assert [n for n, _ in checkpoint_units(model)] == BLOCKS


def test_checkpoint_units_include_and_exclude() -> None:
    model = cifar_resnet18(width=4)
    assert [n for n, _ in checkpoint_units(model, include="[34]")] == ["3", "4"]
    assert [n for n, _ in checkpoint_units(model, include=["9", "10"])] == ["9", "10"]
    assert [n for n, _ in checkpoint_units(model, exclude=["3", "4"])] == BLOCKS[2:]
    assert [n for n, _ in checkpoint_units(model, include="[3-6]", exclude="5")] == ["3", "4", "6"]
    assert checkpoint_units(model, include="nothing.here") == []
    # nested matches are dropped: the outermost match is the unit
    assert [n for n, _ in checkpoint_units(model, include=["3", "3.*"])] == ["3"]
    assert [n for n, _ in checkpoint_units(model, include="3*")] == ["3"]
    # include picks any module, not only blocks
    assert [n for n, _ in checkpoint_units(model, include="3.conv1")] == ["3.conv1"]
    tv = torchvision.models.resnet18(weights=None)
    assert [n for n, _ in checkpoint_units(tv, include="layer1*")] == ["layer1"]
    assert [n for n, _ in checkpoint_units(tv, exclude="layer[12].*")] == [
        f"layer{i}.{j}" for i in (3, 4) for j in (0, 1)
    ]


@pytest.mark.parametrize("bad", [5, [1], b"3", ["3", None]])
def test_checkpoint_units_bad_pattern_type(bad: object) -> None:
    model = cifar_resnet18(width=4)
    with pytest.raises(TypeError):
        checkpoint_units(model, include=bad)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        checkpoint_units(model, exclude=bad)  # type: ignore[arg-type]


# -- stages -----------------------------------------------------------------------------------


def _profile(model: nn.Module, n: int = 2) -> UnitProfile:
    with UnitProfile(checkpoint_units(model), exclude=model.parameters()) as profile:
        model(torch.rand(n, 3, 32, 32))
    return profile


def test_unit_profile_stages_and_savings() -> None:
    model = cifar_resnet18(width=4).train()
    profile = _profile(model)
    assert profile.stages() == [["3", "4"], ["5", "6"], ["7", "8"], ["9", "10"]]
    assert profile.order == BLOCKS
    savings = profile.savings()
    assert len(savings) == 4 and all(s > 0 for s in savings)
    assert all(a > b for a, b in zip(savings, savings[1:]))  # higher resolution frees more
    assert sum(savings) < profile.meter.bytes
    assert not model.get_submodule("3")._forward_hooks  # hooks removed on exit


def test_unit_profile_savings_match_what_checkpointing_frees() -> None:
    model = cifar_resnet18(width=8).train()
    x = torch.rand(8, 3, 32, 32)
    with UnitProfile(checkpoint_units(model), exclude=model.parameters()) as profile:
        out = model(x)
    out.sum().backward()
    plain = profile.meter.bytes
    first = copy.deepcopy(model)
    for name in profile.stages()[0]:
        checkpoint(first.get_submodule(name))
    # the first stage's estimate is what checkpointing it frees, to within 5 %
    freed = plain - _saved_bytes(first, x)
    assert freed == pytest.approx(profile.savings()[0], rel=0.05)


def test_unit_profile_stages_sorted_by_resolution() -> None:
    # a unit that runs at low resolution first still comes after the high-resolution ones
    model = nn.Sequential(
        nn.Conv2d(3, 4, 1),
        _BasicBlock(4, 4, 2),  # 16x16
        nn.Upsample(scale_factor=2),
        _BasicBlock(4, 4, 1),  # 32x32
        _BasicBlock(4, 4, 1),
        _BasicBlock(4, 8, 1),  # same resolution, other shape: a stage of its own
    ).train()
    profile = _profile(model)
    assert profile.order == ["1", "3", "4", "5"]
    assert profile.stages()[0] == ["3", "4"]
    assert sorted(map(tuple, profile.stages())) == [("1",), ("3", "4"), ("5",)]
    assert profile.stages()[-1] == ["1"]


def test_checkpoint_stages_apply() -> None:
    model = cifar_resnet18(width=4).train()
    stages = CheckpointRungs(checkpoint_units(model))
    with pytest.raises(RuntimeError, match="set_stages"):
        stages.apply(1)
    with stages.profile(exclude=model.parameters()) as profile:
        model(torch.rand(2, 3, 32, 32))
    stages.set_stages(profile.stages())
    expected = [[], ["3", "4"], ["3", "4", "5", "6"], BLOCKS[:6], BLOCKS]
    for rung in (1, 4, 2, 0, 3, 3):
        stages.apply(rung)
        assert stages.rung == rung
        assert stages.checkpointed() == expected[rung]
        assert [n for n in BLOCKS if is_checkpointed(model.get_submodule(n))] == expected[rung]
    for bad in (-1, 5):
        with pytest.raises(ValueError, match="rung"):
            stages.apply(bad)
    assert stages.checkpointed() == expected[3]  # unchanged by the bad calls
    stages.release()
    assert stages.checkpointed() == [] and not any(is_checkpointed(m) for m in model.modules())
    with pytest.raises(ValueError, match="unknown units"):
        stages.set_stages([["3"], ["not-a-unit"]])


def test_unit_profile_of_checkpointed_units_finds_the_same_stages() -> None:
    # After an out-of-memory error in the first step the callback retries it with every unit
    # checkpointed and profiles shapes only: the stages must be those of a plain profile.
    model = cifar_resnet18(width=4).train()
    plain = _profile(model, n=4)
    _checkpoint_all(model)
    x = torch.rand(4, 3, 32, 32)
    with UnitProfile(checkpoint_units(model)) as profile:
        out = model(x)
        out.sum().backward()  # the recompute runs inside the profile too
    assert profile.order == plain.order == BLOCKS
    assert profile.stages() == plain.stages() == [["3", "4"], ["5", "6"], ["7", "8"], ["9", "10"]]
    assert all(is_checkpointed(model.get_submodule(n)) for n in BLOCKS)  # the profile changes nothing
    # what it saw saved for backward is not the plain model's (so not rung 0's peak)
    assert profile.meter.bytes < plain.meter.bytes


def test_checkpoint_stages_from_saved_names_without_a_profile() -> None:
    # A resumed run restores the stages its checkpoint names instead of profiling a step.
    model = cifar_resnet18(width=4).train()
    measured = CheckpointRungs(checkpoint_units(model))
    with measured.profile(exclude=model.parameters()) as profile:
        model(torch.rand(2, 3, 32, 32))
    measured.set_stages(profile.stages())
    saved = [list(stage) for stage in measured.stages]  # as a checkpoint keeps them
    measured.release()
    resumed_model = copy.deepcopy(model).double()
    plain = copy.deepcopy(resumed_model)
    resumed = CheckpointRungs(checkpoint_units(resumed_model))
    resumed.set_stages(saved)
    resumed.apply(3)
    assert resumed.stages == saved and resumed.rung == 3
    assert resumed.checkpointed() == BLOCKS[:6]
    x, y = _batch(dtype=torch.float64)
    _assert_same_step(_step(plain, x, y), _step(resumed_model, x, y))  # exact on the restored rung


def test_checkpoint_stages_profile_unchecks_every_unit() -> None:
    model = cifar_resnet18(width=4).train()
    stages = CheckpointRungs(checkpoint_units(model))
    stages.set_stages([["3", "4"], ["5", "6"], ["7", "8"], ["9", "10"]])
    stages.apply(4)
    profile = stages.profile(exclude=model.parameters())
    assert stages.checkpointed() == [] and stages.rung == 0
    with profile:
        model(torch.rand(2, 3, 32, 32)).sum().backward()
    assert len(profile.savings()) == 4
