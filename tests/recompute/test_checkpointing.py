"""Activation checkpointing as a lever: exact gradients, BatchNorm once, fewer bytes, stages."""

import copy

import pytest
import torch
import torch.nn.functional as F
import torchvision
from torch import nn

from lightning_bandlimit.layers.surgery import bandlimit
from lightning_bandlimit.models import cifar_resnet18, small_cnn
from lightning_bandlimit.models.backbones import _BasicBlock
from lightning_bandlimit.recompute import switch
from lightning_bandlimit.recompute.saved_tensors import SavedTensorMeter
from lightning_bandlimit.recompute.stages import (
    CheckpointStages,
    UnitProfile,
    checkpoint,
    checkpoint_units,
    is_checkpointed,
    uncheckpoint,
)

BLOCKS = [str(i) for i in range(3, 11)]  # cifar_resnet18's 8 residual blocks: Sequential indices 3..10


pytestmark = pytest.mark.usefixtures("one_thread")


def _checkpoint_all(model: nn.Module) -> nn.Module:
    for _, unit in checkpoint_units(model):
        checkpoint(unit)
    return model


def _step(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> dict:
    """One training forward and backward: output, loss, parameter and input gradients."""
    x = x.clone().requires_grad_()
    out = model(x)
    loss = F.cross_entropy(out, y)
    loss.backward()
    return {
        "out": out.detach(),
        "loss": loss.detach(),
        "grads": {n: p.grad.clone() for n, p in model.named_parameters()},
        "input_grad": x.grad.clone(),
    }


def _assert_same_step(a: dict, b: dict, atol: float = 1e-12) -> None:
    torch.testing.assert_close(a["out"], b["out"], rtol=0, atol=atol)
    torch.testing.assert_close(a["loss"], b["loss"], rtol=0, atol=atol)
    assert a["grads"].keys() == b["grads"].keys()
    for name in a["grads"]:
        torch.testing.assert_close(a["grads"][name], b["grads"][name], rtol=0, atol=atol, msg=name)
    torch.testing.assert_close(a["input_grad"], b["input_grad"], rtol=0, atol=atol)


def _batch(n: int = 4, dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.rand(n, 3, 32, 32, dtype=dtype), torch.randint(0, 10, (n,))


# -- exactness --------------------------------------------------------------------------------


@pytest.mark.parametrize("compression", [None, 0.5])
def test_gradients_are_exact_in_float64(compression: float | None) -> None:
    model = cifar_resnet18(width=4)
    if compression is not None:
        bandlimit(model, compression)  # band-limited convolutions and memory-lean layers in the blocks
    model = model.double().train()
    checkpointed = _checkpoint_all(copy.deepcopy(model))
    assert sum(is_checkpointed(m) for m in checkpointed.modules()) == 8
    x, y = _batch(dtype=torch.float64)
    plain, ckpt = _step(model, x, y), _step(checkpointed, x, y)
    _assert_same_step(plain, ckpt)
    assert all(g.abs().sum() > 0 for g in ckpt["grads"].values())  # every parameter got a gradient
    if compression is not None:
        return  # band-limited blocks keep their kept spectrum instead: equal to round-off (above)
    # the same operations on the same values: bitwise
    assert all(torch.equal(plain["grads"][n], ckpt["grads"][n]) for n in plain["grads"])
    assert torch.equal(plain["input_grad"], ckpt["input_grad"])


def test_gradients_are_exact_for_a_subset_and_over_several_steps() -> None:
    model = cifar_resnet18(width=4).double().train()
    checkpointed = copy.deepcopy(model)
    for name in ("4", "7", "10"):
        checkpoint(checkpointed.get_submodule(name))
    opts = [torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9) for m in (model, checkpointed)]
    for _ in range(3):
        x, y = _batch(dtype=torch.float64)
        steps = []
        for m, opt in zip((model, checkpointed), opts):
            opt.zero_grad()
            steps.append(_step(m, x, y))
            opt.step()
        _assert_same_step(*steps)
    for (name, a), b in zip(model.state_dict().items(), checkpointed.state_dict().values()):
        assert torch.equal(a, b), name


# -- BatchNorm running statistics -------------------------------------------------------------


def _bn_buffers(model: nn.Module) -> dict[str, torch.Tensor]:
    return {
        name: buffer.clone()
        for name, buffer in model.named_buffers()
        if name.rsplit(".", 1)[-1] in ("running_mean", "running_var", "num_batches_tracked")
    }


def test_batchnorm_running_stats_are_updated_once() -> None:
    model = cifar_resnet18(width=4).double().train()
    checkpointed = _checkpoint_all(copy.deepcopy(model))
    before = _bn_buffers(model)
    x, y = _batch(dtype=torch.float64)
    _step(model, x, y)
    _step(checkpointed, x, y)
    plain, ckpt = _bn_buffers(model), _bn_buffers(checkpointed)
    assert plain.keys() == ckpt.keys() and len(plain) == 3 * 20  # 20 BatchNorm layers
    for name in plain:
        assert torch.equal(plain[name], ckpt[name]), name
    inside = [n for n in ckpt if n.split(".")[0] in BLOCKS and n.endswith("num_batches_tracked")]
    assert inside and all(int(ckpt[n]) == int(before[n]) + 1 == 1 for n in inside)  # once, not twice
    means = [n for n in ckpt if n.split(".")[0] in BLOCKS and n.endswith("running_mean")]
    assert all(not torch.equal(ckpt[n], before[n]) for n in means)  # they were updated


def test_without_the_restore_the_recompute_would_update_batchnorm_twice(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The naive double update (pytorch/pytorch#96136) that the restore exists for.
    model = _checkpoint_all(cifar_resnet18(width=4).train())
    naive = copy.deepcopy(model)
    x, y = _batch()
    _step(model, x, y)
    monkeypatch.setattr(switch, "running_stats_kept", lambda modules: _nothing())
    _step(naive, x, y)
    assert int(model.get_submodule("3.bn1").num_batches_tracked) == 1
    assert int(naive.get_submodule("3.bn1").num_batches_tracked) == 2
    assert not torch.equal(
        model.get_submodule("3.bn1").running_mean, naive.get_submodule("3.bn1").running_mean
    )


class _nothing:  # noqa: N801 - a null context manager standing in for the restore
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


# -- in place, inverse, idempotent ------------------------------------------------------------


def test_state_dict_unchanged_and_uncheckpoint_is_the_exact_inverse() -> None:
    model = cifar_resnet18(width=4)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    units = checkpoint_units(model)
    classes = [type(u) for _, u in units]
    ids = [id(u) for _, u in units]
    params = [id(p) for p in model.parameters()]
    for _, unit in units:
        assert checkpoint(unit) is unit
    assert all(is_checkpointed(u) for _, u in units)
    assert all(type(u) is not c and isinstance(u, c) for (_, u), c in zip(units, classes))
    assert type(units[0][1]).__name__ == "Checkpointed_BasicBlock"
    after = model.state_dict()
    assert list(after) == list(before)
    assert all(torch.equal(after[k], before[k]) for k in before)
    assert [id(p) for p in model.parameters()] == params
    assert [id(m) for _, m in checkpoint_units(model)] == ids  # still found, same objects
    for _, unit in units:
        assert uncheckpoint(unit) is unit
    assert [type(u) for _, u in units] == classes
    assert not any(is_checkpointed(m) for m in model.modules())
    assert list(model.state_dict()) == list(before)


def test_checkpoint_twice_is_idempotent_and_shares_one_subclass() -> None:
    model = cifar_resnet18(width=4)
    a, b = model.get_submodule("3"), model.get_submodule("4")
    checkpoint(a)
    cls = type(a)
    checkpoint(a)
    assert type(a) is cls  # not a subclass of the subclass
    checkpoint(b)
    assert type(b) is cls  # one checkpointed subclass per class
    uncheckpoint(a)
    uncheckpoint(a)
    assert type(a) is type(model.get_submodule("5")) and is_checkpointed(b)


def test_uncheckpoint_of_a_plain_module_and_bad_types() -> None:
    conv = nn.Conv2d(1, 1, 3)
    assert uncheckpoint(conv) is conv and type(conv) is nn.Conv2d
    with pytest.raises(TypeError):
        checkpoint("block")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        uncheckpoint(None)  # type: ignore[arg-type]


def _count_forwards(module: nn.Module) -> list[int]:
    calls = [0]
    module.register_forward_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    return calls


def test_recompute_only_in_training_with_gradients() -> None:
    model = cifar_resnet18(width=4)
    block = checkpoint(model.get_submodule("3"))
    conv, outer = _count_forwards(block.conv1), _count_forwards(block)
    x = torch.rand(2, 3, 32, 32)

    model.train()
    model(x).sum().backward()
    assert conv[0] == 2  # forward, then again in backward
    assert outer[0] == 1  # the block itself is called once

    conv[0] = 0
    with torch.no_grad():
        model(x)
    assert conv[0] == 1  # no gradients: runs as before

    conv[0] = 0
    model.eval()
    out = model(x)
    assert conv[0] == 1
    out.sum().backward()
    assert conv[0] == 1  # eval mode: nothing was checkpointed, nothing recomputed

    conv[0] = 0
    uncheckpoint(block)
    model.train()
    model(x).sum().backward()
    assert conv[0] == 1  # un-checkpointed: no recompute


def test_no_grad_train_mode_output_equals_plain() -> None:
    model = cifar_resnet18(width=4).double().train()
    checkpointed = _checkpoint_all(copy.deepcopy(model))
    x = torch.rand(2, 3, 32, 32, dtype=torch.float64)
    with torch.no_grad():
        assert torch.equal(model(x), checkpointed(x))
    model.eval(), checkpointed.eval()
    assert torch.equal(model(x), checkpointed(x))


# -- bytes saved for backward -----------------------------------------------------------------


def _saved_bytes(model: nn.Module, x: torch.Tensor) -> int:
    with SavedTensorMeter(exclude=model.parameters()) as meter:
        out = model(x)
    out.sum().backward()
    return meter.bytes


def test_checkpointing_saves_fewer_bytes_for_backward() -> None:
    model = cifar_resnet18(width=8).train()
    x = torch.rand(8, 3, 32, 32)
    plain = _saved_bytes(model, x)
    stages_half = copy.deepcopy(model)
    for name in ("3", "4"):
        checkpoint(stages_half.get_submodule(name))
    first_stage = _saved_bytes(stages_half, x)
    everything = _saved_bytes(_checkpoint_all(copy.deepcopy(model)), x)
    assert everything < first_stage < plain
    assert everything < 0.5 * plain  # measured: about a third
    assert _saved_bytes(model, x) == plain  # deterministic byte counts


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
    stages = CheckpointStages(checkpoint_units(model))
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
    measured = CheckpointStages(checkpoint_units(model))
    with measured.profile(exclude=model.parameters()) as profile:
        model(torch.rand(2, 3, 32, 32))
    measured.set_stages(profile.stages())
    saved = [list(stage) for stage in measured.stages]  # as a checkpoint keeps them
    measured.release()
    resumed_model = copy.deepcopy(model).double()
    plain = copy.deepcopy(resumed_model)
    resumed = CheckpointStages(checkpoint_units(resumed_model))
    resumed.set_stages(saved)
    resumed.apply(3)
    assert resumed.stages == saved and resumed.rung == 3
    assert resumed.checkpointed() == BLOCKS[:6]
    x, y = _batch(dtype=torch.float64)
    _assert_same_step(_step(plain, x, y), _step(resumed_model, x, y))  # exact on the restored rung


def test_checkpoint_stages_profile_unchecks_every_unit() -> None:
    model = cifar_resnet18(width=4).train()
    stages = CheckpointStages(checkpoint_units(model))
    stages.set_stages([["3", "4"], ["5", "6"], ["7", "8"], ["9", "10"]])
    stages.apply(4)
    profile = stages.profile(exclude=model.parameters())
    assert stages.checkpointed() == [] and stages.rung == 0
    with profile:
        model(torch.rand(2, 3, 32, 32)).sum().backward()
    assert len(profile.savings()) == 4


# -- copies -----------------------------------------------------------------------------------


def test_a_checkpointed_model_can_be_deep_copied() -> None:
    model = _checkpoint_all(cifar_resnet18(width=4).double().train())
    clone = copy.deepcopy(model)
    assert all(is_checkpointed(clone.get_submodule(n)) for n in BLOCKS)
    assert type(clone.get_submodule("3")) is type(model.get_submodule("3"))
    assert clone.get_submodule("3").conv1.weight is not model.get_submodule("3").conv1.weight
    x, y = _batch(dtype=torch.float64)
    conv = _count_forwards(clone.get_submodule("3").conv1)
    _assert_same_step(_step(model, x, y), _step(clone, x, y))
    assert conv[0] == 2  # the copy recomputes too
    uncheckpoint(clone.get_submodule("3"))
    assert is_checkpointed(model.get_submodule("3"))  # independent of the original
