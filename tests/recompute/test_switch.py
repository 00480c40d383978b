"""Activation checkpointing switched per module (:mod:`lightning_bandlimit.recompute.switch`):
exact gradients, BatchNorm statistics updated once, the exact inverse, fewer bytes, deep copies."""

import copy

import pytest
import torch
from recompute_cases import (
    BLOCKS,
    _assert_same_step,
    _batch,
    _checkpoint_all,
    _count_forwards,
    _saved_bytes,
    _step,
)
from torch import nn

from lightning_bandlimit.layers.surgery import bandlimit
from lightning_bandlimit.models import cifar_resnet18
from lightning_bandlimit.recompute import switch
from lightning_bandlimit.recompute.switch import checkpoint, is_checkpointed, uncheckpoint
from lightning_bandlimit.recompute.unit_choice import checkpoint_units

pytestmark = pytest.mark.usefixtures("one_thread")


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
    assert conv[0] == 1  # no gradients: runs once, as the plain block does

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
