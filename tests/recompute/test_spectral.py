"""Checkpointed band-limited blocks keep only their kept spectrum: exact, smaller, and honest fallbacks."""

import copy
import weakref

import pytest
import torch
import torch.nn.functional as F
import torchvision
from torch import nn

from lightning_bandlimit.functional.lean.ops import pack_mask
from lightning_bandlimit.functional.spectrum_split import input_plan, spectrum_bytes
from lightning_bandlimit.layers.surgery import bandlimit
from lightning_bandlimit.models import cifar_resnet18
from lightning_bandlimit.models.backbones import _BasicBlock
from lightning_bandlimit.recompute.saved_tensors import SavedTensorMeter
from lightning_bandlimit.recompute.spectral import (
    block_plan,
    spectral_fallback,
)
from lightning_bandlimit.recompute.switch import checkpoint, uncheckpoint
from lightning_bandlimit.recompute.unit_choice import checkpoint_units

pytestmark = pytest.mark.usefixtures("one_thread")


def _units(model: nn.Module) -> list[nn.Module]:
    return [unit for _, unit in checkpoint_units(model)]


def _step(model: nn.Module, x: torch.Tensor, y: torch.Tensor, blocks: list[nn.Module]) -> dict:
    """Forward and backward; outputs and gradients of the model and of every block's output."""
    outs: list[torch.Tensor] = []

    def keep(_: nn.Module, __: object, out: torch.Tensor) -> None:
        out.retain_grad()
        outs.append(out)

    handles = [b.register_forward_hook(keep) for b in blocks]
    x = x.clone().requires_grad_()
    torch.manual_seed(1)
    out = model(x)
    F.cross_entropy(out, y).backward()
    for h in handles:
        h.remove()
    return {
        "out": out.detach(),
        "input_grad": x.grad,
        "grads": {n: p.grad for n, p in model.named_parameters()},
        "block_out": [o.detach() for o in outs],
        "block_grad": [o.grad for o in outs],
        "buffers": {n: b.clone() for n, b in model.named_buffers()},
    }


def _assert_close(a: dict, b: dict, atol: float = 1e-10) -> None:
    for key in ("out", "input_grad"):
        torch.testing.assert_close(a[key], b[key], rtol=0, atol=atol, msg=key)
    for key in ("grads", "buffers"):
        for name in a[key]:
            torch.testing.assert_close(a[key][name], b[key][name], rtol=0, atol=atol, msg=f"{key} {name}")
    assert len(a["block_out"]) == len(b["block_out"]) > 0
    for i, (p, q) in enumerate(zip(a["block_out"], b["block_out"])):
        torch.testing.assert_close(p, q, rtol=0, atol=atol, msg=f"block {i} output")
    for i, (p, q) in enumerate(zip(a["block_grad"], b["block_grad"])):
        torch.testing.assert_close(p, q, rtol=0, atol=atol, msg=f"block {i} output gradient")


@pytest.mark.parametrize("compression", [0.25, 0.5, 0.75, 0.9])
def test_gradients_equal_the_band_limited_model_without_checkpointing(compression: float) -> None:
    model = bandlimit(cifar_resnet18(width=4), compression).double().train()
    checkpointed = copy.deepcopy(model)
    units = _units(checkpointed)
    for unit in units:
        checkpoint(unit)
    x, y = torch.rand(4, 3, 32, 32, dtype=torch.float64), torch.randint(0, 10, (4,))
    for _ in range(2):  # two steps: the running statistics accumulate identically
        reference = _step(model, x, y, _units(model))
        kept = _step(checkpointed, x, y, units)
        _assert_close(reference, kept)
    reasons = [spectral_fallback(u) for u in units]
    if compression >= 0.75:
        assert reasons == [None] * 8  # every block kept its spectrum
    else:  # the kept band of a small map's padded grid can be larger than the map
        assert reasons[:2] == [None] * 2
        assert all("is not smaller" in r or "together keep" in r for r in reasons if r), reasons
    assert all(g.abs().sum() > 0 for g in kept["grads"].values())


def test_torchvision_basic_blocks_qualify_and_bottlenecks_fall_back_with_the_reason() -> None:
    x, y = torch.rand(2, 3, 96, 96, dtype=torch.float64), torch.randint(0, 10, (2,))
    for name, expected in (("resnet18", None), ("resnet50", "conv1 (LeanConv2d) is not band-limited")):
        torch.manual_seed(0)
        model = bandlimit(getattr(torchvision.models, name)(num_classes=10), 0.75).double().train()
        checkpointed = copy.deepcopy(model)
        units = _units(checkpointed)
        for unit in units:
            checkpoint(unit)
        _assert_close(_step(model, x, y, _units(model)), _step(checkpointed, x, y, units))
        reasons = [spectral_fallback(u) for u in units]
        if expected is None:  # the blocks on maps large enough for the spectrum to be the smaller form
            assert reasons[:4] == [None] * 4
        else:
            assert all(r is not None and r.startswith(expected) for r in reasons), reasons


def _block_bytes(block: nn.Module, x: torch.Tensor) -> tuple[int, torch.Tensor]:
    x = x.clone().requires_grad_()
    with SavedTensorMeter(exclude=block.parameters()) as meter:
        out = block(x)
    out.sum().backward()
    return meter.bytes, out


@pytest.mark.parametrize("compression", [0.5, 0.9])
def test_a_checkpointed_block_keeps_its_kept_spectrum_and_one_bit_mask(compression: float) -> None:
    block = bandlimit(_BasicBlock(8, 8, 1), compression).train()
    x = torch.rand(4, 8, 16, 16)
    lean_bytes, _ = _block_bytes(block, x)
    checkpoint(block)
    kept, out = _block_bytes(block, x)
    conv = block.conv1
    plan = input_plan(
        x, conv.weight, None, conv.stride, conv.padding, conv.dilation, 1, "zeros", compression, 2
    )
    assert kept == spectrum_bytes(x, plan) + pack_mask(torch.ones(out.shape, dtype=torch.bool)).nbytes
    assert kept < min(x.nbytes, lean_bytes)


def test_a_strided_shortcut_keeps_only_the_pixels_it_reads_and_the_sum_is_recomputed() -> None:
    block = bandlimit(_BasicBlock(8, 16, 2), 0.75).train()
    x = torch.rand(4, 8, 16, 16)
    checkpoint(block)
    kept, out = _block_bytes(block, x)
    conv = block.conv1
    plan = input_plan(x, conv.weight, None, conv.stride, conv.padding, conv.dilation, 1, "zeros", 0.75, 2)
    pixels = x[..., ::2, ::2].nbytes
    # both branches read the input through readers: the sum and the last ReLU are in the region too
    assert kept == spectrum_bytes(x, plan) + pixels
    assert spectral_fallback(block) is None


def test_blocks_fall_back_to_ordinary_checkpointing_and_say_why() -> None:
    x = torch.rand(2, 8, 16, 16)
    cases = {
        "keeps the full band at compression 0.0": bandlimit(_BasicBlock(8, 8, 1), 0.0),
        "is band-limited with memory_lean=False": bandlimit(_BasicBlock(8, 8, 1), 0.5, memory_lean=False),
        "conv1 (Conv2d) is not band-limited": _BasicBlock(8, 8, 1),
    }
    for reason, block in cases.items():
        reference = copy.deepcopy(block).train()
        checkpoint(block.train())
        a = _block_bytes(reference, x)[1]
        b = _block_bytes(block, x)[1]
        torch.testing.assert_close(a, b)
        assert reason in spectral_fallback(block), spectral_fallback(block)
    small = bandlimit(_BasicBlock(8, 8, 1), 0.25).train()
    checkpoint(small)
    _block_bytes(small, torch.rand(2, 8, 4, 4))  # a 6x6 grid's band is larger than a 4x4 map
    assert "is not smaller than the block's input" in spectral_fallback(small)


class _TwoInputs(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(2, 2, 3, padding=1)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return self.conv(x) + y


class _DataDependent(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(2, 2, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x) if x.sum() > 0 else x


def test_structural_reasons() -> None:
    assert block_plan(_TwoInputs()).reason == "its forward takes 2 inputs, not one"
    assert block_plan(_DataDependent()).reason.startswith("torch.fx cannot trace its forward")
    assert block_plan(nn.Sequential(nn.Conv2d(1, 1, 1), nn.ReLU())).reason is None
    assert "function 'mul' " in block_plan(_Scaled()).reason


class _Scaled(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(2, 2, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x) + x * 2


def test_compression_changes_between_steps_and_uncheckpoint_restores_the_plain_path() -> None:
    model = bandlimit(cifar_resnet18(width=4), 0.5).double().train()
    reference = copy.deepcopy(model)
    units = _units(model)
    for unit in units:
        checkpoint(unit)
    x, y = torch.rand(2, 3, 32, 32, dtype=torch.float64), torch.randint(0, 10, (2,))
    for c in (0.5, 0.9, 0.0, 0.75):
        for m in (model, reference):
            for layer in m.modules():
                if hasattr(layer, "compression"):
                    layer.compression = c
        _assert_close(_step(reference, x, y, _units(reference)), _step(model, x, y, units))
        reason = spectral_fallback(units[0])
        assert reason is None if c else "keeps the full band" in reason
    for unit in units:
        uncheckpoint(unit)
    assert not any(hasattr(type(u), "_unchecked_forward") for u in units)


def test_a_deep_copy_of_a_checkpointed_model_keeps_its_spectrum_too() -> None:
    model = bandlimit(cifar_resnet18(width=4), 0.75).train()
    for unit in _units(model):
        checkpoint(unit)
    twin = copy.deepcopy(model)
    x = torch.rand(2, 3, 32, 32)
    with SavedTensorMeter(exclude=model.parameters()) as a:
        model(x).sum().backward()
    with SavedTensorMeter(exclude=twin.parameters()) as b:
        twin(x).sum().backward()
    assert a.bytes == b.bytes
    assert all(spectral_fallback(u) is None for u in _units(twin))


def test_eval_and_no_grad_run_the_block_as_it_is() -> None:
    block = bandlimit(_BasicBlock(4, 4, 1), 0.5).double()
    reference = copy.deepcopy(block)
    checkpoint(block)
    x = torch.rand(2, 4, 8, 8, dtype=torch.float64)
    with torch.no_grad():
        torch.testing.assert_close(block.train()(x), reference.train()(x), rtol=0, atol=1e-12)
    torch.testing.assert_close(block.eval()(x), reference.eval()(x), rtol=0, atol=1e-12)
    assert spectral_fallback(block) is None  # not a checkpointed training forward: nothing recorded


def test_the_recomputed_region_drops_each_feature_map_after_its_last_use() -> None:
    # bn1's output (ReLU'd in place) is read only by conv2: by the time bn2 runs, in the forward
    # and in the recompute, nothing may hold it (a block would otherwise hold all its maps).
    block = bandlimit(_BasicBlock(8, 8, 1), 0.5).train()
    checkpoint(block)
    seen: list = []
    alive_at_bn2: list[bool] = []
    block.bn1.register_forward_hook(lambda m, i, out: seen.append(weakref.ref(out)))
    block.bn2.register_forward_pre_hook(lambda m, i: alive_at_bn2.append(seen[-1]() is not None))
    x = torch.rand(4, 8, 16, 16, requires_grad=True)
    block(x).sum().backward()
    assert spectral_fallback(block) is None
    assert alive_at_bn2 == [False, False]  # the forward, then the recompute


def test_a_block_whose_readers_together_keep_more_than_its_input_falls_back() -> None:
    # A downsampling block at a small compression: conv1's kept spectrum alone is smaller than
    # the input, with the shortcut's pixels it is not; ordinary checkpointing keeps less.
    block = bandlimit(_BasicBlock(8, 16, 2), 0.3).train()
    x = torch.rand(4, 8, 16, 16)
    conv = block.conv1
    plan = input_plan(x, conv.weight, None, conv.stride, conv.padding, conv.dilation, 1, "zeros", 0.3, 2)
    pixels = x[..., ::2, ::2].nbytes
    assert spectrum_bytes(x, plan) < x.nbytes <= spectrum_bytes(x, plan) + pixels
    checkpoint(block)
    kept, _ = _block_bytes(block, x)
    assert "together keep" in spectral_fallback(block)
    assert kept == x.nbytes  # ordinary checkpointing: the input, once
