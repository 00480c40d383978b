"""The pointwise checkpoint mode (:mod:`lightning_bandlimit.recompute.pointwise`) through the switch,
segments and the trial: exact in float64 for every block shape, BatchNorm statistics updated once,
what it keeps pinned storage by storage, switched and back, plain outside training."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn
from torchvision.models.densenet import _DenseLayer
from torchvision.models.resnet import BasicBlock, Bottleneck

from lightning_bandlimit.models import small_cnn
from lightning_bandlimit.recompute import switch
from lightning_bandlimit.recompute.saved_tensors import SavedTensorMeter
from lightning_bandlimit.recompute.segments import Segment, chain_segments
from lightning_bandlimit.recompute.switch import checkpoint, checkpoint_mode, is_checkpointed, uncheckpoint
from lightning_bandlimit.recompute.trial import trial

pytestmark = pytest.mark.usefixtures("one_thread")

F64 = torch.float64


def _bottleneck() -> nn.Module:
    return Bottleneck(8, 4, stride=2, downsample=nn.Sequential(nn.Conv2d(8, 16, 1, 2), nn.BatchNorm2d(16)))


def _dropout_block() -> nn.Module:
    # dropout between the convolutions: its mask reaches conv2's saved input and the weights' gradients
    return nn.Sequential(
        nn.Conv2d(4, 6, 3, padding=1),
        nn.BatchNorm2d(6),
        nn.ReLU(),
        nn.Dropout(0.5),
        nn.Conv2d(6, 4, 3, padding=1),
        nn.BatchNorm2d(4),
        nn.ReLU(),
    )


class _SegmentHolder:
    """A segment of small_cnn (children 4..8: conv, BN, ReLU, max-pool) and its chain."""

    def __init__(self) -> None:
        self.chain = small_cnn(width=4).to(F64).train()
        assert (4, 8) in chain_segments(self.chain)
        self.segment = Segment(self.chain, 4, 8, name="features[4:8]")
        self.head = nn.Sequential(*list(self.chain)[:4])  # the layers before: not measured
        self.params = nn.ModuleList(self.segment.layers())  # the segment's own parameters


# each case: (build the unit, make its input)
CASES: dict[str, tuple[Callable[[], Any], Callable[[], Any]]] = {
    "basic": (lambda: BasicBlock(4, 4), lambda: torch.randn(3, 4, 6, 6, dtype=F64)),
    "bottleneck-downsample": (_bottleneck, lambda: torch.randn(3, 8, 8, 8, dtype=F64)),
    "densenet-list": (
        lambda: _DenseLayer(6, growth_rate=4, bn_size=2, drop_rate=0.0),
        lambda: [torch.randn(3, 2, 6, 6, dtype=F64), torch.randn(3, 4, 6, 6, dtype=F64)],
    ),
    "dropout": (_dropout_block, lambda: torch.randn(3, 4, 6, 6, dtype=F64)),
    "densenet-dropout": (
        lambda: _DenseLayer(4, growth_rate=4, bn_size=2, drop_rate=0.3),
        lambda: [torch.randn(3, 4, 6, 6, dtype=F64)],
    ),
}


def _leaves(x: Any) -> list[torch.Tensor]:
    return list(x) if isinstance(x, list) else [x]


def _fresh(x: Any) -> Any:
    if isinstance(x, list):
        return [t.detach().clone().requires_grad_() for t in x]
    return x.detach().clone().requires_grad_()


def _run(unit: Any, params: nn.Module, x: Any, seed: int = 5) -> dict[str, Any]:
    """One training forward (metered) and backward; a list input is appended to after the call,
    as torchvision's _DenseBlock does."""
    x = _fresh(x)
    inputs = _leaves(x)
    torch.manual_seed(seed)
    with SavedTensorMeter(exclude=params.parameters()) as meter:
        out = unit(x)
    if isinstance(x, list):
        x.append(torch.zeros_like(x[0]))  # the caller's list changes: the recompute must not see it
    weights = torch.randn(out.shape, generator=torch.Generator().manual_seed(11), dtype=out.dtype)
    (out * weights).sum().backward()
    grads = [t.grad.clone() for t in inputs]
    grads += [p.grad.clone() for p in params.parameters()]
    params.zero_grad(set_to_none=True)
    return {"out": out.detach(), "grads": grads, "bytes": meter.bytes, "rng": torch.get_rng_state()}


def _assert_equal_runs(a: dict[str, Any], b: dict[str, Any]) -> None:
    torch.testing.assert_close(a["out"], b["out"], rtol=1e-12, atol=1e-12)
    assert len(a["grads"]) == len(b["grads"])
    for i, (g, h) in enumerate(zip(a["grads"], b["grads"], strict=True)):
        torch.testing.assert_close(g, h, rtol=1e-12, atol=1e-12, msg=f"gradient {i}")


@pytest.mark.parametrize("case", list(CASES))
def test_pointwise_outputs_and_gradients_equal_plain_in_float64(case: str) -> None:
    build, make_input = CASES[case]
    torch.manual_seed(0)
    unit = build().to(F64).train()
    x = make_input()
    state = copy.deepcopy(unit.state_dict())
    plain = _run(unit, unit, x)
    unit.load_state_dict(state)
    checkpoint(unit, case, mode="pointwise")
    pointwise = _run(unit, unit, x)
    assert checkpoint_mode(unit) == "pointwise"
    _assert_equal_runs(plain, pointwise)
    assert all(g.abs().sum() > 0 for g in pointwise["grads"])  # every input and parameter got one
    assert pointwise["bytes"] < plain["bytes"]  # it did run checkpointed: less was kept
    # the recompute replays the random stream; the caller's stream ends where it does plainly
    assert torch.equal(plain["rng"], pointwise["rng"])
    if "dropout" in case:  # the masks matter: another seed gives other outputs
        other = _run(unit, unit, x, seed=6)
        assert not torch.allclose(other["out"], pointwise["out"])
    uncheckpoint(unit)


def test_pointwise_segment_of_small_cnn_equals_plain_in_float64() -> None:
    torch.manual_seed(0)
    holder = _SegmentHolder()
    x = holder.head(torch.randn(3, 3, 16, 16, dtype=F64)).detach()
    state = copy.deepcopy(holder.chain.state_dict())
    run = lambda t: holder.segment(t)  # noqa: E731
    plain = _run(run, holder.params, x)
    holder.chain.load_state_dict(state)
    checkpoint(holder.segment, mode="pointwise")
    assert checkpoint_mode(holder.segment) == "pointwise"
    assert type(holder.chain).__name__ == "SegmentedSequential"
    pointwise = _run(run, holder.params, x)
    holder.chain.load_state_dict(state)
    checkpoint(holder.segment, mode="full")
    full = _run(run, holder.params, x)
    # the input's, the conv's weight, the BN's weight and bias (the conv has no bias)
    assert len(pointwise["grads"]) == 4 and all(g.abs().sum() > 0 for g in pointwise["grads"])
    _assert_equal_runs(plain, pointwise)
    _assert_equal_runs(plain, full)
    # kept: the input (4 channels at 8x8) and the convolution's output (8 channels at 8x8); BN,
    # ReLU and the max-pool (its input and indices) are recomputed
    assert x.shape == (3, 4, 8, 8)
    assert pointwise["bytes"] == x.nelement() * 8 + 2 * x.nelement() * 8
    assert full["bytes"] == x.nelement() * 8 < pointwise["bytes"] < plain["bytes"]
    uncheckpoint(holder.segment)
    assert type(holder.chain) is nn.Sequential


def test_whole_small_cnn_with_every_segment_pointwise_equals_plain() -> None:
    torch.manual_seed(0)
    chain = small_cnn(width=4).to(F64).train()
    segments = [Segment(chain, a, b) for a, b in chain_segments(chain)]
    x = torch.randn(3, 3, 16, 16, dtype=F64)
    state = copy.deepcopy(chain.state_dict())
    plain = _run(chain, chain, x)
    chain.load_state_dict(state)
    for segment in segments:
        checkpoint(segment, mode="pointwise")
    pointwise = _run(chain, chain, x)
    _assert_equal_runs(plain, pointwise)
    assert pointwise["bytes"] < plain["bytes"]
    for segment in segments:
        uncheckpoint(segment)
    assert type(chain) is nn.Sequential


# -- BatchNorm statistics ---------------------------------------------------------------------


def _bn_layers(module: nn.Module) -> list[nn.BatchNorm2d]:
    return [m for m in module.modules() if isinstance(m, nn.BatchNorm2d)]


@pytest.mark.parametrize("case", ["basic", "bottleneck-downsample", "densenet-list"])
def test_batchnorm_running_stats_are_updated_once(case: str) -> None:
    build, make_input = CASES[case]
    torch.manual_seed(0)
    plain = build().to(F64).train()
    other = copy.deepcopy(plain)
    checkpoint(other, mode="pointwise")
    x = make_input()
    _run(plain, plain, x)
    _run(other, other, x)
    for (name, a), b in zip(plain.named_buffers(), other.buffers(), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=name)
    for bn in _bn_layers(other):
        assert int(bn.num_batches_tracked) == 1
        assert bn.running_mean.abs().sum() > 0  # updated at all


def test_batchnorm_running_stats_of_a_pointwise_segment_are_updated_once() -> None:
    torch.manual_seed(0)
    holder = _SegmentHolder()
    reference = copy.deepcopy(holder.chain)
    x = holder.head(torch.randn(3, 3, 16, 16, dtype=F64)).detach()
    checkpoint(holder.segment, mode="pointwise")
    _run(lambda t: holder.segment(t), holder.params, x)
    same = nn.Sequential(*list(reference)[4:8])
    _run(same, same, x)
    bn = holder.chain[5]
    assert int(bn.num_batches_tracked) == 1
    torch.testing.assert_close(bn.running_mean, reference[5].running_mean, rtol=0, atol=0)
    torch.testing.assert_close(bn.running_var, reference[5].running_var, rtol=0, atol=0)
    uncheckpoint(holder.segment)


# -- what it keeps ----------------------------------------------------------------------------


def _pointers(tensors: list[torch.Tensor]) -> set[int]:
    return {t.untyped_storage().data_ptr() for t in tensors}


def _kept_storages(block: nn.Module, x: torch.Tensor) -> tuple[dict[int, int], dict[str, torch.Tensor]]:
    """The storages saved for backward in one training forward, and the outputs of the block's
    convolutions, BatchNorms and the block (held alive, so no address is reused)."""
    seen: dict[str, torch.Tensor] = {}
    handles = [
        m.register_forward_hook(lambda _, __, out, n=n: seen.__setitem__(n, out))
        for n, m in block.named_modules()
        if isinstance(m, (nn.Conv2d, nn.BatchNorm2d))
    ]
    x = x.detach().clone().requires_grad_()
    with SavedTensorMeter(exclude=block.parameters()) as meter:
        out = block(x)
    for handle in handles:
        handle.remove()
    seen["input"], seen["output"] = x, out
    storages = meter.storages_by_label()[None]
    out.sum().backward()
    return storages, seen


def test_a_basic_block_keeps_its_input_and_its_convolutions_outputs_only() -> None:
    torch.manual_seed(0)
    block = BasicBlock(4, 4).to(F64).train()
    x = torch.randn(2, 4, 6, 6, dtype=F64)
    size = x.nelement() * 8  # every map of the block has the input's shape
    stat = 4 * 8  # a BatchNorm's per-channel tensor

    plain, seen = _kept_storages(block, x)
    # plain: the input (conv1's), conv1's output (bn1's), bn1's output that ReLU changed in place
    # (relu's and conv2's), conv2's output (bn2's) and the output (the last in-place ReLU's);
    # each BatchNorm's running mean and variance and its batch mean and inverse std
    big = {p for p, n in plain.items() if n == size}
    assert big == _pointers([seen[k] for k in ("input", "conv1", "bn1", "conv2", "output")])
    assert sorted(n for n in plain.values() if n != size) == [stat] * 8
    buffers = [b for bn in (block.bn1, block.bn2) for b in (bn.running_mean, bn.running_var)]
    assert _pointers(buffers) <= set(plain)

    checkpoint(block, mode="pointwise")
    pointwise, seen = _kept_storages(block, x)
    # pointwise: the input and the two convolutions' outputs; BatchNorm, ReLU and the sum are
    # recomputed from them, the output is whatever follows the block's to keep
    assert set(pointwise) == _pointers([seen[k] for k in ("input", "conv1", "conv2")])
    assert sum(pointwise.values()) == 3 * size == sum(plain.values()) - 2 * size - 8 * stat

    checkpoint(block, mode="full")
    full, seen = _kept_storages(block, x)
    assert set(full) == _pointers([seen["input"]]) and sum(full.values()) == size
    assert sum(full.values()) < sum(pointwise.values()) < sum(plain.values())
    uncheckpoint(block)


def test_a_bottleneck_keeps_its_input_and_all_four_convolutions_outputs() -> None:
    torch.manual_seed(0)
    block = _bottleneck().to(F64).train()
    checkpoint(block, mode="pointwise")
    kept, seen = _kept_storages(block, torch.randn(2, 8, 8, 8, dtype=F64))
    convs = ("conv1", "conv2", "conv3", "downsample.0")
    assert set(kept) == _pointers([seen["input"], *(seen[c] for c in convs)])
    assert sum(kept.values()) == sum(t.nelement() * 8 for t in [seen["input"], *(seen[c] for c in convs)])
    uncheckpoint(block)


# -- switching --------------------------------------------------------------------------------


def test_pointwise_then_full_then_back_restores_the_class_and_keys() -> None:
    block = BasicBlock(4, 4)
    keys = list(block.state_dict())
    params = [id(p) for p in block.parameters()]
    assert checkpoint(block, "b", mode="pointwise") is block
    sub = type(block)
    assert sub.__name__ == "CheckpointedBasicBlock" and isinstance(block, BasicBlock)
    assert checkpoint_mode(block) == "pointwise" and is_checkpointed(block)
    checkpoint(block, "b", mode="full")
    assert type(block) is sub and checkpoint_mode(block) == "full"  # the same subclass, mode changed
    checkpoint(block, mode="pointwise")
    assert checkpoint_mode(block) == "pointwise"
    assert uncheckpoint(block) is block
    assert type(block) is BasicBlock and checkpoint_mode(block) is None and not is_checkpointed(block)
    assert list(block.state_dict()) == keys and [id(p) for p in block.parameters()] == params
    # checkpointed again, it starts in the mode asked (the old mode is forgotten)
    assert checkpoint_mode(checkpoint(block)) == "full"
    uncheckpoint(block)


def test_an_unknown_mode_raises_and_changes_nothing() -> None:
    block = BasicBlock(4, 4)
    with pytest.raises(ValueError, match="bogus"):
        checkpoint(block, mode="bogus")
    assert type(block) is BasicBlock
    checkpoint(block, mode="pointwise")
    with pytest.raises(ValueError, match="mode"):
        checkpoint(block, mode="Full")
    assert checkpoint_mode(block) == "pointwise"
    segment = _SegmentHolder().segment
    with pytest.raises(ValueError, match="mode"):
        checkpoint(segment, mode="bogus")
    assert checkpoint_mode(segment) is None
    uncheckpoint(block)


def test_segment_checkpoint_rejects_an_unknown_mode() -> None:
    segment = _SegmentHolder().segment
    try:
        with pytest.raises(ValueError):
            segment.checkpoint("bogus")
    finally:
        segment.uncheckpoint()


@pytest.mark.parametrize("how", ["eval", "no_grad"])
def test_outside_training_with_gradients_the_plain_forward_runs(how: str, monkeypatch) -> None:
    torch.manual_seed(0)
    block = BasicBlock(4, 4).to(F64)
    reference = copy.deepcopy(block)
    checkpoint(block, mode="pointwise")

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("checkpointed outside a training forward with gradients")

    monkeypatch.setattr(switch, "checkpoint_call", refuse)
    x = torch.randn(2, 4, 6, 6, dtype=F64, requires_grad=True)
    for m in (block, reference):
        m.train(how != "eval")
    if how == "eval":
        with SavedTensorMeter(exclude=block.parameters()) as meter:
            out = block(x)
        with SavedTensorMeter(exclude=reference.parameters()) as ref_meter:
            expected = reference(x)
        assert meter.bytes == ref_meter.bytes > 0  # what the plain eval forward saves, no less
    else:
        with torch.no_grad():
            out, expected = block(x), reference(x)
        assert not out.requires_grad
        assert int(block.bn1.num_batches_tracked) == 1  # a training forward all the same
    torch.testing.assert_close(out, expected, rtol=0, atol=0)
    assert checkpoint_mode(block) == "pointwise"
    block.train()
    with pytest.raises(AssertionError, match="outside"):  # the guard above is live in training
        block(x)
    uncheckpoint(block)


# -- the trial --------------------------------------------------------------------------------


class _MutatesInput(nn.Module):
    """Changes its input in place: the recompute would see the changed input."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1, self.conv2 = nn.Conv2d(2, 2, 3, padding=1), nn.Conv2d(2, 2, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.conv2(self.conv1(x * 1).relu())
        x.add_(1)
        return out


class _ReadsItsOwnState(nn.Module):
    """Its forward reads a count its forward changes: the recompute multiplies by another."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1, self.conv2 = nn.Conv2d(2, 2, 3, padding=1), nn.Conv2d(2, 2, 3, padding=1)
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return self.conv2(self.conv1(x).relu() * self.calls)


def test_the_pointwise_trial_accepts_exact_units_and_leaves_their_state() -> None:
    torch.manual_seed(0)
    block = BasicBlock(2, 2)
    before = copy.deepcopy(block.state_dict())
    sample = (torch.randn(3, 2, 5, 5, requires_grad=True),)
    assert trial("block", block, sample, mode="pointwise") is None
    assert type(block) is BasicBlock  # not checkpointed before: not after
    for key, value in block.state_dict().items():
        torch.testing.assert_close(value, before[key], rtol=0, atol=0, msg=key)
    checkpoint(block, "block", mode="pointwise")
    assert trial("block", block, sample, mode="full") is None
    assert checkpoint_mode(block) == "pointwise"  # its mode left as it was
    checkpoint(block, "block", mode="full")
    assert trial("block", block, sample, mode="pointwise") is None
    assert checkpoint_mode(block) == "full"
    uncheckpoint(block)
    dense = _DenseLayer(4, growth_rate=2, bn_size=2, drop_rate=0.2)
    assert trial("dense", dense, ([torch.randn(3, 4, 5, 5, requires_grad=True)],), mode="pointwise") is None


@pytest.mark.parametrize("unit", [_MutatesInput, _ReadsItsOwnState])
@pytest.mark.parametrize("mode", ["pointwise", "full"])
def test_the_trial_refuses_units_that_are_not_recomputable_in_either_mode(unit: type, mode: str) -> None:
    torch.manual_seed(0)
    module = unit()
    # a sample that does not require grad: the in-place change of a leaf would fail plainly too
    sample = (torch.randn(3, 2, 5, 5),)
    reason = trial("odd", module, sample, mode=mode)
    assert reason is not None and reason.startswith("odd: checkpointed")
    assert type(module) is unit


def test_a_convolution_output_changed_in_place_is_refused_in_pointwise_mode_only() -> None:
    # VGG's conv -> ReLU(inplace=True): the pointwise mode keeps the convolution's output, which the
    # ReLU then changes; torch's selective checkpoint refuses that in backward, named by the unit
    torch.manual_seed(0)
    block = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(inplace=True), nn.Conv2d(4, 4, 3, padding=1))
    sample = (torch.randn(2, 3, 6, 6, requires_grad=True),)
    assert trial("vgg-like", block, sample, mode="full") is None
    reason = trial("vgg-like", block, sample, mode="pointwise")
    assert reason is not None and reason.startswith("vgg-like: checkpointed, it raised RecomputeMismatch")
    assert "vgg-like" in reason.split("RecomputeMismatch", 1)[1]
    checkpoint(block, "vgg-like", mode="pointwise")
    out = block(sample[0].detach().clone().requires_grad_())
    with pytest.raises(RuntimeError, match="'vgg-like'"):
        out.sum().backward()
    uncheckpoint(block)


def test_a_segments_default_name_names_its_chains_class() -> None:
    chain = nn.Sequential(nn.Conv2d(1, 1, 3), nn.MaxPool2d(2), nn.Conv2d(1, 1, 3))
    assert repr(Segment(chain, 0, 2)) == "Segment(Sequential[0:2])"
