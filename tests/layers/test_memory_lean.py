"""Memory-lean training: gradients equal the model without it, and far less is kept for backward.

The reference is the same band-limited model with ``memory_lean=False`` (plain BatchNorm, ReLU,
pooling, and every band-limited layer keeping its input spectrum): whole networks in float64
(<= 1e-10 relative), conv-BN-ReLU chains in float32 (<= 1e-5). Saved bytes are deterministic,
so they are asserted against the plain ``nn.Conv2d`` model.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from lightning_bandlimit import SavedTensorMeter, bandlimit, set_compression, unbandlimit
from lightning_bandlimit.functional import fft_conv2d
from lightning_bandlimit.functional.dft_plan import dft_plan
from lightning_bandlimit.functional.geometry import resolve_geometry
from lightning_bandlimit.functional.lean import handoff, regions
from lightning_bandlimit.functional.lean.ops import lean_relu, pack_mask, unpack_mask
from lightning_bandlimit.functional.lean.pool import lean_max_pool2d
from lightning_bandlimit.functional.lean.sources import Saved
from lightning_bandlimit.functional.spectral_kernel import _batch_slices
from lightning_bandlimit.functional.spectrum_split import input_plan, spectrum_bytes
from lightning_bandlimit.layers.lean import LeanBatchNorm2d, LeanModule, LeanReLU
from lightning_bandlimit.models.backbones import cifar_resnet18

torchvision = pytest.importorskip("torchvision")


def _step(model: nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor], list[torch.Tensor]]:
    """One training forward/backward: (output, parameter gradients, buffers afterwards)."""
    model.train()
    model.zero_grad(set_to_none=True)
    torch.manual_seed(1)  # the same dropout masks for both models
    out = model(x)
    (out.square().mean() + out.mean()).backward()
    grads = [p.grad.clone() for p in model.parameters()]
    return out.detach(), grads, [b.clone() for b in model.buffers()]


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def _assert_same_step(base: nn.Module, x: torch.Tensor, compression: float, tol: float) -> None:
    lean = bandlimit(copy.deepcopy(base), compression, memory_lean=True)
    ref = bandlimit(copy.deepcopy(base), compression, memory_lean=False)
    out_l, grads_l, bufs_l = _step(lean, x)
    out_r, grads_r, bufs_r = _step(ref, x)
    assert _rel(out_l, out_r) <= tol
    # A conv bias before BatchNorm has a zero gradient (round-off only): relative to 1e-3 of the
    # largest gradient, not to its own round-off.
    floor = 1e-3 * max(g.norm() for g in grads_r)
    for (name, _), g_l, g_r in zip(lean.named_parameters(), grads_l, grads_r):
        assert ((g_l - g_r).norm() / torch.maximum(g_r.norm(), floor)).item() <= tol, name
    for b_l, b_r in zip(bufs_l, bufs_r):  # BatchNorm running statistics and batch counts
        assert torch.allclose(b_l.double(), b_r.double(), rtol=tol, atol=tol)


class ConvBNReLU(nn.Sequential):
    def __init__(self, dims: int = 2, bias: bool = False) -> None:
        conv, bn = (nn.Conv1d, nn.BatchNorm1d) if dims == 1 else (nn.Conv2d, nn.BatchNorm2d)
        super().__init__(
            conv(3, 8, 3, padding=1, bias=False),
            bn(8),
            nn.ReLU(inplace=True),
            conv(8, 8, 3, padding=1, bias=bias),
            bn(8),
            nn.ReLU(),
            conv(8, 6, 1, stride=2, bias=bias),
            bn(6),
            nn.ReLU(inplace=True),
            conv(6, 4, 3, stride=2, padding=1),
        )


@pytest.mark.parametrize("compression", [0.0, 0.3, 0.5, 0.9])
@pytest.mark.parametrize("dims", [1, 2])
def test_conv_bn_relu_chain_float32(compression: float, dims: int) -> None:
    torch.manual_seed(0)
    shape = (16, 3, 256) if dims == 1 else (16, 3, 32, 32)
    _assert_same_step(ConvBNReLU(dims), torch.randn(shape), compression, 1e-5)


@pytest.mark.parametrize("compression", [0.0, 0.5])
@pytest.mark.parametrize("dims", [1, 2])
def test_conv_with_bias_before_batchnorm_float64(compression: float, dims: int) -> None:
    # The bias is part of the kept-spectrum recipe a BatchNorm recomputes its input from.
    torch.manual_seed(0)
    shape = (4, 3, 40) if dims == 1 else (4, 3, 16, 16)
    x = torch.randn(shape, dtype=torch.float64)
    _assert_same_step(ConvBNReLU(dims, bias=True).double(), x, compression, 1e-10)


@pytest.mark.parametrize("compression", [0.0, 0.5, 0.75])
@pytest.mark.parametrize(
    "name, shape",
    [
        ("cifar_resnet18", (3, 3, 32, 32)),
        ("resnet18", (2, 3, 64, 64)),  # torchvision: max-pool stem, in-place `out += identity`
        ("mobilenet_v3_small", (2, 3, 64, 64)),  # depthwise, Hardswish, squeeze-excitation
    ],
)
def test_whole_networks_float64(name: str, shape: tuple[int, ...], compression: float) -> None:
    torch.manual_seed(0)
    if name == "cifar_resnet18":
        model = cifar_resnet18(10, width=4)
    else:
        model = torchvision.models.get_model(name, weights=None, num_classes=10)
    _assert_same_step(model.double(), torch.rand(shape, dtype=torch.float64), compression, 1e-10)


def test_compression_changed_at_run_time_stays_exact() -> None:
    torch.manual_seed(0)
    base = cifar_resnet18(10, width=4).double()
    lean = bandlimit(copy.deepcopy(base), 0.75)
    ref = bandlimit(copy.deepcopy(base), 0.75, memory_lean=False)
    x = torch.rand(2, 3, 32, 32, dtype=torch.float64)
    for c in (0.75, 0.25, 0.0, 0.5):
        set_compression(lean, c)
        set_compression(ref, c)
        _, g_l, _ = _step(lean, x)
        _, g_r, _ = _step(ref, x)
        assert max(_rel(a, b) for a, b in zip(g_l, g_r)) <= 1e-10


def _saved_bytes(model: nn.Module, x: torch.Tensor) -> int:
    model.train()
    with SavedTensorMeter(exclude=model.parameters()) as meter:
        model(x)
    return meter.bytes


def test_saved_bytes_fall_below_plain_convolutions_and_with_compression() -> None:
    torch.manual_seed(0)
    base = cifar_resnet18(10, width=8)
    x = torch.rand(4, 3, 32, 32)
    plain = _saved_bytes(base, x)
    ratios = [_saved_bytes(bandlimit(copy.deepcopy(base), c), x) / plain for c in (0.0, 0.5, 0.75, 0.9)]
    assert ratios == sorted(ratios, reverse=True)
    for ratio, target in zip(ratios, (1.0, 0.70, 0.45, 0.30)):  # the targets
        assert ratio <= target
    # Without memory-lean training a band-limited ResNet keeps more than the plain one.
    assert _saved_bytes(bandlimit(copy.deepcopy(base), 0.5, memory_lean=False), x) > plain


def test_nothing_is_kept_or_published_without_gradients() -> None:
    model = bandlimit(cifar_resnet18(10, width=4), 0.5)
    x = torch.rand(2, 3, 32, 32)
    handoff._REGISTRY.entries.clear()
    with torch.no_grad():
        model.train()(x)
    with torch.inference_mode():
        out = model.eval()(x)
    assert not handoff._REGISTRY.entries
    with torch.no_grad():
        ref = bandlimit(copy.deepcopy(model), 0.5, memory_lean=False).eval()(x)
    unbandlimit(model)
    assert torch.allclose(out, ref, atol=1e-5)


def test_unbandlimit_restores_every_swapped_module_and_keys_stay() -> None:
    model = torchvision.models.resnet18(num_classes=10)
    types = {name: type(m) for name, m in model.named_modules()}
    objects = {name: id(m) for name, m in model.named_modules()}
    keys = list(model.state_dict())
    bandlimit(model, 0.5)
    swapped = {name for name, m in model.named_modules() if type(m) is not types[name]}
    assert {types[n] for n in swapped} == {nn.Conv2d, nn.BatchNorm2d, nn.ReLU, nn.MaxPool2d}
    assert list(model.state_dict()) == keys
    unbandlimit(model)
    assert {name: type(m) for name, m in model.named_modules()} == types
    assert {name: id(m) for name, m in model.named_modules()} == objects
    for module in model.modules():
        assert not hasattr(module, "memory_lean")


def test_patterns_limit_the_companion_swaps_and_the_switch_turns_it_off() -> None:
    model = cifar_resnet18(10, width=4)
    bandlimit(model, 0.5, include="3.*")
    assert isinstance(model[3].bn1, LeanBatchNorm2d) and type(model[1]) is nn.BatchNorm2d
    plain_model = bandlimit(cifar_resnet18(10, width=4), 0.5, memory_lean=False)
    assert not any(isinstance(m, LeanModule) for m in plain_model.modules())
    assert all(not layer.memory_lean for layer in plain_model.modules() if hasattr(layer, "memory_lean"))
    with pytest.raises(TypeError, match="memory_lean must be"):
        bandlimit(nn.Conv2d(1, 1, 3), 0.5, memory_lean=1)  # type: ignore[arg-type]


def test_model_without_batchnorm_or_relu_trains_exactly() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.GELU(), nn.Conv2d(8, 8, 3, padding=1), nn.Tanh())
    _assert_same_step(model.double(), torch.randn(2, 3, 12, 12, dtype=torch.float64), 0.5, 1e-10)


def test_in_place_change_after_batchnorm_is_not_mistaken_for_the_recipe() -> None:
    class AddThenRelu(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv, self.bn, self.relu = (
                nn.Conv2d(4, 4, 3, padding=1),
                nn.BatchNorm2d(4),
                nn.ReLU(inplace=True),
            )
            self.conv2 = nn.Conv2d(4, 4, 3, padding=1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            out = self.bn(self.conv(x))
            out += x  # in place: `out` is no longer affine(conv(x))
            return self.conv2(self.relu(out))

    torch.manual_seed(0)
    _assert_same_step(AddThenRelu().double(), torch.randn(2, 4, 10, 10, dtype=torch.float64), 0.5, 1e-10)


class Checkpointed(nn.Module):
    def __init__(self, use_reentrant: bool) -> None:
        super().__init__()
        self.use_reentrant = use_reentrant
        self.stem = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU(inplace=True)
        )
        self.block = nn.Sequential(
            nn.Conv2d(8, 8, 3, padding=1, bias=False),
            nn.BatchNorm2d(8),
            nn.ReLU(inplace=True),
            nn.Conv2d(8, 8, 3, padding=1, bias=False),
            nn.BatchNorm2d(8),
            nn.ReLU(inplace=True),
        )
        self.head = nn.Conv2d(8, 2, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.stem(x)  # the region's input carries a published recipe
        out = checkpoint(self.block, out, use_reentrant=self.use_reentrant)
        return self.head(out)


@pytest.mark.parametrize("use_reentrant", [False, True])
@pytest.mark.parametrize("compression", [0.0, 0.5])
def test_inside_torch_utils_checkpoint_regions(use_reentrant: bool, compression: float) -> None:
    torch.manual_seed(0)
    base = Checkpointed(use_reentrant).double()
    x = torch.randn(2, 3, 12, 12, dtype=torch.float64, requires_grad=use_reentrant)
    _assert_same_step(base, x, compression, 1e-10)


def test_autocast_bfloat16_on_cpu() -> None:
    torch.manual_seed(0)
    base = cifar_resnet18(10, width=4)
    x = torch.rand(4, 3, 32, 32)
    results = []
    for lean in (True, False):
        model = bandlimit(copy.deepcopy(base), 0.5, memory_lean=lean).train()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = model(x)
        assert out.dtype == torch.bfloat16
        out.float().square().mean().backward()
        results.append([p.grad.clone() for p in model.parameters()])
    for g_l, g_r in zip(*results):
        assert g_l.dtype == torch.float32
        assert _rel(g_l, g_r) <= 5e-2  # bfloat16 activations: both round at about 2^-8


@pytest.mark.parametrize("momentum", [0.1, None])
@pytest.mark.parametrize("track", [True, False])
def test_batchnorm_statistics_match_plain(momentum: float | None, track: bool) -> None:
    torch.manual_seed(0)
    plain = nn.BatchNorm1d(5, momentum=momentum, track_running_stats=track).double()
    lean = bandlimit(nn.Sequential(copy.deepcopy(plain)), 0.0)[0]
    assert isinstance(lean, LeanModule)
    for _ in range(3):
        x = torch.randn(7, 5, dtype=torch.float64, requires_grad=True)
        _assert_close_modules(plain, lean, x)


def _assert_close_modules(plain: nn.Module, lean: nn.Module, x: torch.Tensor) -> None:
    out_p = plain(x)
    out_l = lean(x)
    gp = torch.autograd.grad(out_p.square().sum(), [x, *plain.parameters()])
    gl = torch.autograd.grad(out_l.square().sum(), [x, *lean.parameters()])
    assert torch.allclose(out_p, out_l, rtol=1e-12, atol=1e-12)
    for a, b in zip(gp, gl):
        assert torch.allclose(a, b, rtol=1e-10, atol=1e-12)
    for a, b in zip(plain.buffers(), lean.buffers()):
        assert torch.equal(a, b) if a.dtype == torch.long else torch.allclose(a, b, rtol=1e-12, atol=1e-12)


def test_batchnorm_rejects_a_single_value_per_channel_like_plain() -> None:
    bn = bandlimit(nn.Sequential(nn.BatchNorm1d(3)), 0.0)[0]
    with pytest.raises(ValueError, match="Expected more than 1 value per channel"):
        bn(torch.randn(1, 3, requires_grad=True))


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(kernel_size=2),
        dict(kernel_size=3, stride=2, padding=1),
        dict(kernel_size=3, stride=1, padding=1, dilation=2),
        dict(kernel_size=(2, 3), stride=(2, 1), ceil_mode=True),
    ],
)
def test_max_pool_keeps_one_byte_per_output_and_matches(kwargs: dict) -> None:
    torch.manual_seed(0)
    x = torch.randn(2, 3, 9, 11, dtype=torch.float64, requires_grad=True)
    with SavedTensorMeter() as meter:
        out = lean_max_pool2d(x, **kwargs)
    assert meter.bytes == out.numel()  # uint8 offsets, not the input
    grad = torch.randn_like(out)
    (g_lean,) = torch.autograd.grad(out, x, grad)
    (g_plain,) = torch.autograd.grad(F.max_pool2d(x, **kwargs), x, grad)
    assert torch.allclose(out, F.max_pool2d(x, **kwargs)) and torch.allclose(g_lean, g_plain)


@pytest.mark.parametrize("numel", [1, 7, 8, 9, 64, 1001])
def test_mask_packing_round_trips(numel: int) -> None:
    mask = torch.rand(numel) > 0.5
    packed = pack_mask(mask)
    assert packed.dtype == torch.uint8 and packed.numel() == -(-numel // 8)
    assert torch.equal(unpack_mask(packed, (numel,)), mask)


def test_relu_keeps_a_bit_mask_and_passes_nan_gradients_like_plain() -> None:
    x = torch.tensor([[-1.0, 0.0, 2.0, float("nan")] * 8], requires_grad=True)
    relu = bandlimit(nn.Sequential(nn.ReLU()), 0.0)[0]
    assert isinstance(relu, LeanReLU)
    with SavedTensorMeter() as meter:
        activation = x * 1.0
        handoff.publish(activation, Saved(), ())  # as a band-limited convolution marks its output
        out = relu(activation)
    assert meter.bytes == x.numel() // 8
    (g,) = torch.autograd.grad(out, x, torch.ones_like(out))
    (g_plain,) = torch.autograd.grad(F.relu(x * 1.0), x, torch.ones_like(out))
    assert torch.equal(g.isnan(), g_plain.isnan()) and torch.equal(g.nan_to_num(), g_plain.nan_to_num())


@pytest.mark.parametrize("memory_lean", [False, True])
def test_large_grid_spectra_are_computed_a_batch_slice_at_a_time(memory_lean: bool) -> None:
    # stride 4 on a 40x40 map: the kept band of the 46x46 grid is far larger than the 10x10
    # output, so forward and backward run in batch slices; the result must not change.
    torch.manual_seed(0)
    x = torch.randn(6, 2, 40, 40, dtype=torch.float64, requires_grad=True)
    w = torch.randn(5, 2, 7, 7, dtype=torch.float64, requires_grad=True)
    b = torch.randn(5, dtype=torch.float64, requires_grad=True)
    geometry = resolve_geometry(x, w, b, 4, 3, 1, 1, "zeros", 2)
    plan = dft_plan(geometry, 0.25, torch.float64, x.device)
    assert len(_batch_slices(plan, 6, 5, 6 * 5 * 10 * 10 * 8, 8)) > 1
    out = fft_conv2d(x, w, b, stride=4, padding=3, compression=0.25, memory_lean=memory_lean)
    grad = torch.randn_like(out)
    got = torch.autograd.grad(out, (x, w, b), grad)
    # the same convolution, one sample at a time (no slicing inside)
    outs = [fft_conv2d(x[i : i + 1], w, b, stride=4, padding=3, compression=0.25) for i in range(6)]
    want = torch.autograd.grad(torch.cat(outs), (x, w, b), grad)
    assert torch.allclose(out, torch.cat(outs), rtol=1e-10, atol=1e-12)
    for a, e in zip(got, want):
        assert torch.allclose(a, e, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("shape", [(5, 3, 7), (9, 4, 2, 2), (3,)])
def test_relu_gradient_matches_plain_for_any_shape(shape: tuple[int, ...]) -> None:
    x = torch.randn(shape, dtype=torch.float64, requires_grad=True)
    grad = torch.randn(shape, dtype=torch.float64)
    (g_lean,) = torch.autograd.grad(lean_relu(x * 1.0), x, grad)
    (g_plain,) = torch.autograd.grad(F.relu(x * 1.0), x, grad)
    assert torch.equal(g_lean, g_plain)


def test_lean_modules_are_the_plain_ones_at_compression_zero() -> None:
    # Nothing descends from a band-limited convolution above c = 0: the lean twins keep what the
    # plain modules keep (no mask beside a kept output, no subsampled copy) and run their kernels.
    torch.manual_seed(0)
    plain = cifar_resnet18(10, width=8)
    lean = bandlimit(copy.deepcopy(plain), 0.0)
    x = torch.rand(4, 3, 32, 32)
    assert _saved_bytes(lean, x) == _saved_bytes(plain, x)
    relu = LeanReLU()
    with SavedTensorMeter() as meter:
        relu(torch.randn(2, 16, requires_grad=True) * 1.0)
    assert meter.bytes == 2 * 16 * 4  # its output, as nn.ReLU keeps


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("compression", [0.5, 0.9])
def test_a_stem_hands_its_output_on_as_a_recompute_from_its_own_kept_input(
    bias: bool, compression: float
) -> None:
    # A conv widening 2 channels to 16: its BatchNorm keeps nothing the conv does not keep
    # already (the output is recomputed from the conv's kept input), and the step stays exact.
    torch.manual_seed(0)
    base = nn.Sequential(nn.Conv2d(2, 16, 3, padding=1, bias=bias), nn.BatchNorm2d(16), nn.ReLU(inplace=True))
    base = base.double()
    x = torch.randn(4, 2, 12, 12, dtype=torch.float64)
    _assert_same_step(base, x, compression, 1e-10)
    lean = bandlimit(copy.deepcopy(base), compression).train()
    with SavedTensorMeter(exclude=lean.parameters()) as meter:
        out = lean(x)
    # the conv keeps the image (or its smaller spectrum), the ReLU its bit mask, BatchNorm two
    # per-channel vectors; not the output's spectrum (about 12 times the image here)
    mask = pack_mask(torch.ones(out.shape, dtype=torch.bool)).nbytes
    assert meter.bytes <= x.nbytes + mask + 2 * 16 * 8


def test_keeping_spectra_trades_a_recipe_for_the_spectrum_the_forward_made_anyway() -> None:
    # After a lean BatchNorm and ReLU, a band-limited conv keeps their recipe (nothing new); in
    # a recomputed region (keeping_spectra) it keeps its input's kept spectrum instead.
    torch.manual_seed(0)
    model = bandlimit(
        nn.Sequential(
            nn.Conv2d(4, 8, 3, padding=1, bias=False),
            nn.BatchNorm2d(8),
            nn.ReLU(),
            nn.Conv2d(8, 8, 3, padding=1, bias=False),
        ),
        0.5,
    ).train()
    x = torch.randn(2, 4, 16, 16)
    with SavedTensorMeter(exclude=model.parameters()) as recipe:
        model(x)
    with regions.keeping_spectra(), SavedTensorMeter(exclude=model.parameters()) as spectra:
        out = model(x)
    assert not regions.keeps_spectra()
    conv = model[3]
    plan = input_plan(torch.empty(2, 8, 16, 16), conv.weight, None, 1, 1, 1, 1, "zeros", 0.5, 2)
    # the recipe read the conv's spectrum and BatchNorm's two per-channel vectors (scale, shift)
    assert spectra.bytes - recipe.bytes == spectrum_bytes(out, plan) - 2 * 8 * 4


def test_a_strided_stem_keeps_its_output_as_before() -> None:
    # Its output spectrum lives on the input's grid: making it again would cost its forward.
    base = nn.Sequential(nn.Conv2d(2, 16, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU())
    lean = bandlimit(base, 0.9).train()
    lean[0].algorithm = "spectral"
    x = torch.randn(4, 2, 12, 12)
    with SavedTensorMeter(exclude=lean.parameters()) as meter:
        out = lean(x)
    mask = pack_mask(torch.ones(out.shape, dtype=torch.bool)).nbytes
    assert meter.bytes > x.nbytes + mask + 2 * 16 * 4  # BatchNorm keeps the output's spectrum


@pytest.mark.parametrize("algorithm", ["spectral", "spatial"])
def test_in_a_checkpointed_region_a_conv_keeps_the_held_input_and_hands_no_spectrum_on(
    algorithm: str,
) -> None:
    # The checkpoint holds its unit's input until the recompute: a smaller form of it (the kept
    # spectrum, the band projection) would be a second copy, and a spectrum handed to the next
    # BatchNorm would be rebuilt at full size inside the unit's own backward.
    torch.manual_seed(0)
    x = torch.randn(4, 8, 16, 16, requires_grad=True)
    w = torch.randn(8, 8, 3, 3, requires_grad=True)

    def conv() -> tuple[torch.Tensor, int, str]:
        with SavedTensorMeter(exclude=(w,)) as meter:
            out = fft_conv2d(x, w, padding=1, compression=0.5, memory_lean=True, algorithm=algorithm)
            found = handoff.lookup(out)  # valid under the hooks it was published under
        return out, meter.bytes, type(found[0]).__name__ if found else "none"

    outside, outside_bytes, outside_recipe = conv()
    with regions.checkpointed_region([x]):
        inside, inside_bytes, inside_recipe = conv()
    assert outside_bytes < x.nbytes  # a smaller form of the input, where nothing else holds it
    assert inside_bytes == x.nbytes
    assert inside_recipe in ("Saved", "none")
    if algorithm == "spectral":
        assert outside_recipe == "Spectrum"
    torch.testing.assert_close(inside, outside)
