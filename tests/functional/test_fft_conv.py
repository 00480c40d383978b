"""Tests of :func:`fft_conv2d` / :func:`fft_conv1d`.

* at ``compression=0``: equal to ``F.conv2d`` / ``nn.Conv2d`` (output and all gradients);
* at ``compression>0``: equal to an independent ``torch.fft`` reference of the documented
  semantics (circular cross-correlation of the band-limited padded input with the band-limited
  dilated filter, on the padded grid, read at ``i * stride``);
* gradcheck, memory saved for backward, mixed precision, argument errors, CUDA.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import nn

from lightning_bandlimit.functional import fft_conv1d, fft_conv2d, spectral_band

MODES = ("zeros", "reflect", "replicate", "circular")
GROUP_KINDS = ("one", "two", "depthwise", "depthwise_mult")

pytestmark = pytest.mark.filterwarnings("ignore:Using padding='same' with even kernel")

FAST = dict(deadline=None, derandomize=True, database=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.fixture(autouse=True, scope="module")
def _single_thread():
    """The tensors here are tiny: intra-op threads only add synchronisation overhead (tens of ms
    per op on a loaded 2-core machine). Restored after the module."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


# --------------------------------------------------------------------------------------------
# Cases
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    """One convolution call. ``batch == 0`` means an unbatched input."""

    dims: int
    batch: int
    in_channels: int
    out_channels: int
    groups: int
    size: tuple[int, ...]
    kernel: tuple[int, ...]
    stride: int | tuple[int, ...]
    padding: int | tuple[int, ...] | str
    dilation: int | tuple[int, ...]
    padding_mode: str
    bias: bool
    seed: int = 0

    def as_tuple(self, value) -> tuple[int, ...]:
        if isinstance(value, int):
            return (value,) * self.dims
        return tuple(value)

    @property
    def strides(self) -> tuple[int, ...]:
        return self.as_tuple(self.stride)

    @property
    def dilations(self) -> tuple[int, ...]:
        return self.as_tuple(self.dilation)

    @property
    def pads(self) -> list[tuple[int, int]]:
        """(before, after) per spatial dim, as torch resolves ``padding``."""
        if self.padding == "valid":
            return [(0, 0)] * self.dims
        if self.padding == "same":
            totals = [d * (k - 1) for d, k in zip(self.dilations, self.kernel)]
            return [(t // 2, t - t // 2) for t in totals]
        return [(p, p) for p in self.as_tuple(self.padding)]

    @property
    def grid(self) -> tuple[int, int]:
        padded = [n + a + b for n, (a, b) in zip(self.size, self.pads)]
        return (1, padded[0]) if self.dims == 1 else (padded[0], padded[1])

    def tensors(self, dtype=torch.float64, requires_grad=False):
        g = torch.Generator().manual_seed(self.seed)
        shape = ((self.batch,) if self.batch else ()) + (self.in_channels, *self.size)
        x = torch.randn(shape, generator=g, dtype=dtype)
        w = torch.randn(
            self.out_channels, self.in_channels // self.groups, *self.kernel, generator=g, dtype=dtype
        )
        b = torch.randn(self.out_channels, generator=g, dtype=dtype) if self.bias else None
        if requires_grad:
            x.requires_grad_(True)
            w.requires_grad_(True)
            if b is not None:
                b.requires_grad_(True)
        return x, w, b, g

    def kwargs(self):
        return dict(
            stride=self.stride,
            padding=self.padding,
            dilation=self.dilation,
            groups=self.groups,
            padding_mode=self.padding_mode,
        )


def fft_conv(case: Case, x, w, b, compression=0.0):
    fn = fft_conv1d if case.dims == 1 else fft_conv2d
    return fn(x, w, b, compression=compression, **case.kwargs())


def torch_conv(case: Case, x, w, b):
    """``F.conv{1,2}d`` for zero padding, else ``nn.Conv{1,2}d`` with ``padding_mode`` and ``w``."""
    batched = x if case.batch else x.unsqueeze(0)
    if case.padding_mode == "zeros":
        conv = F.conv1d if case.dims == 1 else F.conv2d
        y = conv(batched, w, b, case.stride, case.padding, case.dilation, case.groups)
    else:
        module_type = nn.Conv1d if case.dims == 1 else nn.Conv2d
        module = module_type(
            case.in_channels,
            case.out_channels,
            case.kernel,
            stride=case.stride,
            padding=case.padding,
            dilation=case.dilation,
            groups=case.groups,
            bias=b is not None,
            padding_mode=case.padding_mode,
            dtype=x.dtype,
        )
        params = {"weight": w} if b is None else {"weight": w, "bias": b}
        y = torch.func.functional_call(module, params, (batched,))
    return y if case.batch else y.squeeze(0)


def band_mask(grid: tuple[int, int], compression: float) -> torch.Tensor:
    """Boolean ``(H, W // 2 + 1)`` mask of the kept rfft2 coefficients, from the documented spec."""
    band = spectral_band(grid, compression)
    height, width = grid
    mask = torch.zeros(height, width // 2 + 1, dtype=torch.bool)
    n = band.half_rows
    if 2 * n + 1 >= height:
        row_keep = torch.ones(height, dtype=torch.bool)
    else:
        row_keep = torch.zeros(height, dtype=torch.bool)
        row_keep[: n + 1] = True
        if n > 0:
            row_keep[-n:] = True
    mask[row_keep, : band.cols] = True
    return mask


def banded_reference(case: Case, x, w, b, compression: float):
    """Independent ``torch.fft`` implementation of the documented semantics (differentiable)."""
    batched = x if case.batch else x.unsqueeze(0)
    flat_pads = [p for pair in reversed(case.pads) for p in pair]  # F.pad: last dim first
    mode = "constant" if case.padding_mode == "zeros" else case.padding_mode
    xp = F.pad(batched, flat_pads, mode=mode)
    w2 = w
    if case.dims == 1:
        xp, w2 = xp.unsqueeze(-2), w.unsqueeze(-2)
    dil = (1, *case.dilations) if case.dims == 1 else case.dilations
    strides = (1, *case.strides) if case.dims == 1 else case.strides
    grid = tuple(xp.shape[-2:])
    assert grid == case.grid
    mask = band_mask(grid, compression)
    samples = math.prod(batched.shape[2:])
    if 2 * int(mask.sum()) > 1.1 * samples:  # documented: the band would outgrow the input
        mask = torch.ones_like(mask)

    def limit(t):
        return torch.fft.irfft2(torch.fft.rfft2(t) * mask, s=grid)

    kh, kw = w2.shape[-2:]
    ext = ((kh - 1) * dil[0] + 1, (kw - 1) * dil[1] + 1)
    wd = w2.new_zeros(*w2.shape[:2], *grid)
    wd[..., : ext[0] : dil[0], : ext[1] : dil[1]] = w2
    xb, wb = limit(xp), limit(wd)

    n, c = xb.shape[:2]
    o, g = w2.shape[0], case.groups
    xf = torch.fft.rfft2(xb).reshape(n, g, c // g, *mask.shape)
    wf = torch.fft.rfft2(wb).reshape(g, o // g, c // g, *mask.shape)
    yf = torch.einsum("ngchk,gochk->ngohk", xf, wf.conj()).reshape(n, o, *mask.shape)
    y = torch.fft.irfft2(yf, s=grid)  # y[p, q] = sum_{u, v} xb[p + u, q + v] wb[u, v], circular
    out_size = [(gs - e) // s + 1 for gs, e, s in zip(grid, ext, strides)]
    y = y[..., : out_size[0] * strides[0] : strides[0], : out_size[1] * strides[1] : strides[1]]
    if b is not None:
        y = y + b.view(1, -1, 1, 1)
    if case.dims == 1:
        y = y.squeeze(-2)
    return y if case.batch else y.squeeze(0)


def assert_rel_close(actual, expected, rtol, what="", floor=1e-3):
    """``max |actual - expected| <= rtol * max |expected|``.

    ``floor`` bounds the scale from below, for a reference that is (almost) identically zero,
    e.g. an output that only reads zero padding; all test data are O(1).
    """
    assert actual.shape == expected.shape, f"{what}: shape {tuple(actual.shape)} != {tuple(expected.shape)}"
    assert actual.dtype == expected.dtype, f"{what}: dtype {actual.dtype} != {expected.dtype}"
    scale = max(expected.abs().max().item(), floor) if expected.numel() else 0.0
    err = (actual - expected).abs().max().item() if expected.numel() else 0.0
    assert err <= rtol * scale + 1e-300, f"{what}: max abs diff {err:.3e} > {rtol:.0e} * {scale:.3e}"


def check_against(case: Case, reference, compression: float, dtype, rtol: float):
    """Output and gradients (input, weight, bias) of ``fft_conv`` vs ``reference``."""
    x, w, b, g = case.tensors(dtype, requires_grad=True)
    leaves = [x, w] + ([b] if b is not None else [])
    expected = reference(case, x, w, b)
    actual = fft_conv(case, x, w, b, compression)
    assert_rel_close(actual, expected.detach(), rtol, f"output {case}")
    grad_out = torch.randn(expected.shape, generator=g, dtype=dtype)
    expected_grads = torch.autograd.grad(expected, leaves, grad_out)
    actual_grads = torch.autograd.grad(actual, leaves, grad_out)
    for name, a, e in zip(("input", "weight", "bias"), actual_grads, expected_grads):
        assert_rel_close(a, e, rtol, f"grad {name} {case}")


# --------------------------------------------------------------------------------------------
# Strategy
# --------------------------------------------------------------------------------------------


@st.composite
def conv_cases(draw, dims: int) -> Case:
    mode = draw(st.sampled_from(MODES))
    kind = draw(st.sampled_from(GROUP_KINDS))
    if kind == "one":
        groups, cin, cout = 1, draw(st.integers(1, 3)), draw(st.integers(1, 3))
    elif kind == "two":
        groups, cin, cout = 2, 2 * draw(st.integers(1, 2)), 2 * draw(st.integers(1, 2))
    elif kind == "depthwise":
        cin = draw(st.integers(2, 4))
        groups, cout = cin, cin
    else:  # depthwise with a channel multiplier
        cin = draw(st.integers(2, 3))
        groups, cout = cin, cin * draw(st.integers(2, 3))

    kernel = tuple(draw(st.integers(1, 4)) for _ in range(dims))
    dilations = tuple(draw(st.integers(1, 3)) for _ in range(dims))
    padding_kind = draw(st.sampled_from(["int", "tuple", "same", "valid"]))
    if padding_kind == "same":
        strides = (1,) * dims
    else:
        strides = tuple(draw(st.integers(1, 3)) for _ in range(dims))
    if padding_kind == "int":
        p = draw(st.integers(0, 3))
        padding, pads = p, [(p, p)] * dims
    elif padding_kind == "tuple":
        ps = tuple(draw(st.integers(0, 3)) for _ in range(dims))
        padding, pads = ps, [(p, p) for p in ps]
    elif padding_kind == "same":
        totals = [d * (k - 1) for d, k in zip(dilations, kernel)]
        padding, pads = "same", [(t // 2, t - t // 2) for t in totals]
    else:
        padding, pads = "valid", [(0, 0)] * dims

    size = []
    for k, d, (before, after) in zip(kernel, dilations, pads):
        lower = max(1, d * (k - 1) + 1 - before - after)  # kernel fits the padded input
        if mode == "reflect":
            lower = max(lower, max(before, after) + 1)  # torch: pad < size
        if mode == "circular":
            lower = max(lower, max(before, after))  # torch: pad <= size
        size.append(draw(st.integers(lower, lower + 7)))

    def int_or_tuple(values):
        if len(set(values)) == 1 and draw(st.booleans()):
            return values[0]
        return values

    return Case(
        dims=dims,
        batch=draw(st.sampled_from([0, 1, 2])),
        in_channels=cin,
        out_channels=cout,
        groups=groups,
        size=tuple(size),
        kernel=kernel,
        stride=int_or_tuple(strides),
        padding=padding,
        dilation=int_or_tuple(dilations),
        padding_mode=mode,
        bias=draw(st.booleans()),
        seed=draw(st.integers(0, 2**31 - 1)),
    )


# Hand-picked cases that every run covers, whatever hypothesis draws.
EXPLICIT_CASES = [
    # odd/even, non-square input and kernel, asymmetric "same" (even kernel, dilation 2)
    Case(2, 2, 3, 4, 1, (9, 12), (2, 3), 1, "same", (2, 1), "zeros", True),
    Case(2, 1, 3, 4, 1, (10, 7), (4, 2), 1, "same", (1, 3), "reflect", True),
    Case(2, 0, 4, 6, 2, (11, 8), (3, 3), 2, 1, 1, "replicate", False),  # unbatched, groups 2
    Case(2, 2, 4, 4, 4, (8, 9), (3, 3), (2, 3), (1, 2), 2, "circular", True),  # depthwise
    Case(2, 1, 3, 9, 3, (13, 6), (5, 2), (3, 1), (2, 0), (1, 2), "zeros", True),  # depthwise x3
    Case(2, 2, 2, 3, 1, (6, 6), (6, 6), 1, "valid", 1, "zeros", True),  # kernel == input
    Case(2, 1, 2, 2, 1, (5, 4), (3, 3), 1, (4, 3), 1, "circular", False),  # pad == size
    Case(2, 1, 2, 2, 2, (5, 4), (3, 3), 3, (4, 3), 1, "reflect", True),  # pad == size - 1
    Case(2, 1, 1, 1, 1, (1, 1), (1, 1), 1, 0, 1, "zeros", True),  # 1x1
    Case(2, 3, 3, 5, 1, (16, 15), (3, 3), 2, 1, 1, "zeros", True),
    Case(1, 2, 3, 4, 1, (17,), (5,), 2, 2, 2, "zeros", True),
    Case(1, 0, 4, 8, 4, (12,), (3,), 1, "same", 3, "reflect", True),  # unbatched, depthwise x2
    Case(1, 1, 4, 2, 2, (10,), (4,), (3,), (3,), (1,), "circular", False),
    Case(1, 2, 2, 3, 1, (9,), (2,), 1, "same", 2, "replicate", True),
]


# --------------------------------------------------------------------------------------------
# (a) exactness at compression 0
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("case", EXPLICIT_CASES, ids=lambda c: f"{c.dims}d-{c.padding_mode}-g{c.groups}")
def test_matches_torch_explicit_cases_float64(case):
    check_against(case, torch_conv, 0.0, torch.float64, 1e-9)


@pytest.mark.parametrize("case", EXPLICIT_CASES, ids=lambda c: f"{c.dims}d-{c.padding_mode}-g{c.groups}")
def test_matches_torch_explicit_cases_float32(case):
    check_against(case, torch_conv, 0.0, torch.float32, 1e-4)


@settings(max_examples=100, **FAST)
@given(case=conv_cases(2))
def test_conv2d_matches_torch_float64(case):
    check_against(case, torch_conv, 0.0, torch.float64, 1e-9)


@settings(max_examples=80, **FAST)
@given(case=conv_cases(1))
def test_conv1d_matches_torch_float64(case):
    check_against(case, torch_conv, 0.0, torch.float64, 1e-9)


@settings(max_examples=40, **FAST)
@given(case=conv_cases(2))
def test_conv2d_matches_torch_float32(case):
    check_against(case, torch_conv, 0.0, torch.float32, 1e-4)


@settings(max_examples=30, **FAST)
@given(case=conv_cases(1))
def test_conv1d_matches_torch_float32(case):
    check_against(case, torch_conv, 0.0, torch.float32, 1e-4)


def test_default_arguments_match_f_conv2d():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 3, 10, 9, generator=g, dtype=torch.float64)
    w = torch.randn(5, 3, 3, 2, generator=g, dtype=torch.float64)
    assert_rel_close(fft_conv2d(x, w), F.conv2d(x, w), 1e-9, "defaults 2d")
    x1 = torch.randn(2, 3, 11, generator=g, dtype=torch.float64)
    w1 = torch.randn(5, 3, 4, generator=g, dtype=torch.float64)
    assert_rel_close(fft_conv1d(x1, w1), F.conv1d(x1, w1), 1e-9, "defaults 1d")


def test_weight_only_and_input_only_gradients():
    # Backward when only one of input / weight requires grad (the saved spectrum is optional).
    case = EXPLICIT_CASES[0]
    x, w, b, _ = case.tensors()
    for x_grad, w_grad in ((True, False), (False, True)):
        xx, ww = x.clone().requires_grad_(x_grad), w.clone().requires_grad_(w_grad)
        leaf = xx if x_grad else ww
        for compression in (0.0, 0.5):
            (actual,) = torch.autograd.grad(fft_conv(case, xx, ww, b, compression).square().sum(), leaf)
            xr, wr = x.clone().requires_grad_(x_grad), w.clone().requires_grad_(w_grad)
            ref_leaf = xr if x_grad else wr
            (expected,) = torch.autograd.grad(
                banded_reference(case, xr, wr, b, compression).square().sum(), ref_leaf
            )
            assert_rel_close(actual, expected, 1e-9, f"x_grad={x_grad} c={compression}")


# --------------------------------------------------------------------------------------------
# (b) gradcheck
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("compression", [0.0, 0.5])
@pytest.mark.parametrize(
    "case",
    [
        Case(2, 2, 4, 4, 2, (7, 6), (3, 2), 2, 1, 1, "zeros", True),  # stride 2, groups 2, bias
        Case(2, 1, 2, 4, 2, (6, 7), (2, 3), (1, 2), (2, 1), (2, 1), "reflect", True),  # depthwise x2
        Case(2, 0, 2, 3, 1, (5, 6), (3, 3), 1, "same", 1, "circular", True),  # unbatched
    ],
    ids=["2d-s2-g2", "2d-depthwise-reflect", "2d-unbatched-circular"],
)
def test_gradcheck_conv2d(case, compression):
    x, w, b, _ = case.tensors(torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(
        lambda x, w, b: fft_conv(case, x, w, b, compression), (x, w, b), eps=1e-6, atol=1e-7
    )


@pytest.mark.parametrize("compression", [0.0, 0.5])
@pytest.mark.parametrize(
    "case",
    [
        Case(1, 2, 3, 2, 1, (11,), (3,), 2, 2, 2, "zeros", True),
        Case(1, 1, 2, 4, 2, (9,), (2,), 1, "same", 1, "replicate", True),
    ],
    ids=["1d-s2-d2", "1d-g2-replicate"],
)
def test_gradcheck_conv1d(case, compression):
    x, w, b, _ = case.tensors(torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(
        lambda x, w, b: fft_conv(case, x, w, b, compression), (x, w, b), eps=1e-6, atol=1e-7
    )


# --------------------------------------------------------------------------------------------
# (c) compression > 0 against the independent torch.fft reference
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("case", EXPLICIT_CASES[:10], ids=lambda c: f"{c.dims}d-{c.padding_mode}-g{c.groups}")
def test_reference_itself_matches_torch_at_zero(case):
    # Validates the test's reference: at c = 0 it must be the ordinary convolution.
    x, w, b, _ = case.tensors()
    assert_rel_close(banded_reference(case, x, w, b, 0.0), torch_conv(case, x, w, b), 1e-9, "reference")


@pytest.mark.parametrize("compression", [0.1, 0.5, 0.9])
@pytest.mark.parametrize("case", EXPLICIT_CASES, ids=lambda c: f"{c.dims}d-{c.padding_mode}-g{c.groups}")
def test_banded_matches_reference_explicit(case, compression):
    check_against(case, lambda *a: banded_reference(*a, compression), compression, torch.float64, 1e-9)


@settings(max_examples=100, **FAST)
@given(case=conv_cases(2), compression=st.sampled_from([0.1, 0.25, 0.5, 0.75, 0.9]))
def test_banded_conv2d_matches_reference(case, compression):
    check_against(case, lambda *a: banded_reference(*a, compression), compression, torch.float64, 1e-9)


@settings(max_examples=50, **FAST)
@given(case=conv_cases(1), compression=st.sampled_from([0.1, 0.25, 0.5, 0.75, 0.9]))
def test_banded_conv1d_matches_reference(case, compression):
    check_against(case, lambda *a: banded_reference(*a, compression), compression, torch.float64, 1e-9)


@pytest.mark.parametrize("compression", [0.1, 0.5, 0.9])
def test_banded_float32_matches_reference(compression):
    case = Case(2, 2, 4, 6, 2, (15, 16), (3, 3), 1, 1, 1, "reflect", True)
    check_against(case, lambda *a: banded_reference(*a, compression), compression, torch.float32, 1e-4)


@pytest.mark.parametrize("dims", [1, 2])
def test_compression_changes_the_output(dims):
    case = EXPLICIT_CASES[9] if dims == 2 else EXPLICIT_CASES[10]
    x, w, b, _ = case.tensors()
    full = fft_conv(case, x, w, b, 0.0)
    banded = fft_conv(case, x, w, b, 0.5)
    assert banded.shape == full.shape
    assert (banded - full).abs().max() > 1e-3 * full.abs().max()


def smooth_input(shape, seed=0):
    """Random field with a Gaussian-decaying spectrum (mostly low frequencies)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g, dtype=torch.float64)
    fy = torch.fft.fftfreq(shape[-2], dtype=torch.float64)[:, None]
    fx = torch.fft.rfftfreq(shape[-1], dtype=torch.float64)[None, :]
    envelope = torch.exp(-(fy**2 + fx**2) / (2 * 0.08**2))
    return torch.fft.irfft2(torch.fft.rfft2(x) * envelope, s=shape[-2:])


def test_error_grows_with_compression_on_smooth_input():
    x = smooth_input((2, 4, 32, 32))
    g = torch.Generator().manual_seed(3)
    w = torch.randn(6, 4, 3, 3, generator=g, dtype=torch.float64)
    exact = F.conv2d(x, w, padding=1)
    errors = []
    for c in (0.0, 0.25, 0.5, 0.75):
        y = fft_conv2d(x, w, padding=1, compression=c)
        errors.append(((y - exact).norm() / exact.norm()).item())
    assert errors[0] < 1e-12, errors
    assert all(a < b for a, b in zip(errors, errors[1:])), errors
    # A smooth input loses little at moderate compression.
    assert errors[1] < 0.2, errors


def test_error_grows_with_compression_1d():
    x = smooth_input((2, 3, 1, 64))[:, :, 0]
    g = torch.Generator().manual_seed(4)
    w = torch.randn(5, 3, 5, generator=g, dtype=torch.float64)
    exact = F.conv1d(x, w, padding=2)
    errors = [
        ((fft_conv1d(x, w, padding=2, compression=c) - exact).norm() / exact.norm()).item()
        for c in (0.0, 0.25, 0.5, 0.75)
    ]
    assert errors[0] < 1e-12, errors
    assert all(a < b for a, b in zip(errors, errors[1:])), errors


def test_full_band_compression_is_exact():
    # On a 3x3 grid a small request rounds to the full band: the result is the exact conv.
    x = torch.randn(1, 2, 3, 3, dtype=torch.float64)
    w = torch.randn(2, 2, 2, 2, dtype=torch.float64)
    assert spectral_band((3, 3), 0.05).is_full
    assert_rel_close(fft_conv2d(x, w, compression=0.05), F.conv2d(x, w), 1e-9, "full band")


# --------------------------------------------------------------------------------------------
# (d) memory saved for backward
# --------------------------------------------------------------------------------------------


def saved_activation_storages(compression: float):
    """Unique storages saved for backward by one spectral fft_conv2d call, parameters excluded."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(8, 16, 32, 32, generator=g, requires_grad=True)
    weight = nn.Parameter(torch.randn(16, 16, 3, 3, generator=g) * 0.1)
    param_ptrs = {weight.untyped_storage().data_ptr()}
    storages: dict[int, int] = {}
    numels: list[int] = []

    def pack(t):
        storage = t.untyped_storage()
        numels.append(t.numel())
        if storage.data_ptr() not in param_ptrs:
            storages[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        y = fft_conv2d(x, weight, padding=1, compression=compression, algorithm="spectral")
    y.square().sum().backward()  # the saved tensors still give gradients
    assert x.grad is not None and weight.grad is not None
    assert torch.isfinite(x.grad).all() and torch.isfinite(weight.grad).all()
    return sum(storages.values()), numels, x


def test_saved_bytes_shrink_with_compression():
    bytes0, numels0, x = saved_activation_storages(0.0)
    input_bytes = x.numel() * x.element_size()
    padded_numel = 8 * 16 * 34 * 34
    # At c = 0 the saved spectrum (padded grid, re + im, one-sided) is larger than the input.
    assert bytes0 > input_bytes, (bytes0, input_bytes)
    assert all(n not in (x.numel(), padded_numel) for n in numels0), numels0
    sizes = [bytes0]
    for c in (0.25, 0.5, 0.75):
        saved, numels, _ = saved_activation_storages(c)
        achieved = spectral_band((34, 34), c).compression
        ratio = saved / bytes0
        expected = 1.0 - achieved
        assert abs(ratio - expected) <= 0.15 * expected, (c, achieved, ratio)
        # No full-size spatial copy of the input (or the padded input) is kept.
        assert all(n < x.numel() for n in numels), (c, numels, x.numel())
        sizes.append(saved)
    assert all(a > b for a, b in zip(sizes, sizes[1:])), sizes
    assert sizes[-1] < input_bytes, (sizes, input_bytes)


# --------------------------------------------------------------------------------------------
# (e) mixed precision
# --------------------------------------------------------------------------------------------


def _mp_tensors():
    g = torch.Generator().manual_seed(7)
    x = torch.randn(2, 4, 12, 11, generator=g)
    w = torch.randn(6, 4, 3, 3, generator=g)
    b = torch.randn(6, generator=g)
    return x, w, b


@pytest.mark.parametrize("compression", [0.0, 0.5])
def test_autocast_bf16_cpu(compression):
    x, w, b = _mp_tensors()
    reference = fft_conv2d(x, w, b, padding=1, compression=compression)
    assert reference.dtype == torch.float32
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = fft_conv2d(x, w, b, padding=1, compression=compression)
        torch_out = F.conv2d(x, w, b, padding=1)
    assert out.dtype == torch.bfloat16 == torch_out.dtype
    assert_rel_close(out.float(), reference, 2e-2, "autocast bf16")


def test_autocast_bf16_cpu_conv1d():
    g = torch.Generator().manual_seed(8)
    x, w = torch.randn(2, 3, 20, generator=g), torch.randn(4, 3, 3, generator=g)
    reference = fft_conv1d(x, w, padding=1)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = fft_conv1d(x, w, padding=1)
    assert out.dtype == torch.bfloat16
    assert_rel_close(out.float(), reference, 2e-2, "autocast bf16 1d")


def test_autocast_leaves_float64_alone():
    x, w, b = (t.double() for t in _mp_tensors())
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = fft_conv2d(x, w, b, padding=1)
    assert out.dtype == torch.float64
    assert_rel_close(out, F.conv2d(x, w, b, padding=1), 1e-9, "float64 under autocast")


@pytest.mark.parametrize("dtype, rtol", [(torch.bfloat16, 2e-2), (torch.float16, 5e-3)])
@pytest.mark.parametrize("compression", [0.0, 0.5])
def test_half_precision_inputs_keep_their_dtype(dtype, rtol, compression):
    x, w, b = (t.to(dtype) for t in _mp_tensors())
    out = fft_conv2d(x, w, b, padding=1, compression=compression)
    assert out.dtype == dtype
    reference = fft_conv2d(x.float(), w.float(), b.float(), padding=1, compression=compression)
    assert_rel_close(out.float(), reference, rtol, f"{dtype}")
    x1, w1 = x[:, :, 0], w[:, :, 0]
    out1 = fft_conv1d(x1, w1, b, padding=1, compression=compression)
    assert out1.dtype == dtype
    reference1 = fft_conv1d(x1.float(), w1.float(), b.float(), padding=1, compression=compression)
    assert_rel_close(out1.float(), reference1, rtol, f"{dtype} 1d")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_backward(dtype):
    x, w, b = (t.to(dtype).requires_grad_(True) for t in _mp_tensors())
    fft_conv2d(x, w, b, padding=1, compression=0.25).float().square().sum().backward()
    assert x.grad.dtype == w.grad.dtype == b.grad.dtype == dtype
    assert all(torch.isfinite(t.grad.float()).all() for t in (x, w, b))


@pytest.mark.parametrize("compression", [0.0, 0.5])
def test_backward_under_autocast(compression):
    x, w, b = _mp_tensors()
    x.requires_grad_(True)
    weight, bias = nn.Parameter(w.clone()), nn.Parameter(b.clone())
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = fft_conv2d(x, weight, bias, padding=1, compression=compression)
        loss = out.float().sum()
    assert out.dtype == torch.bfloat16
    loss.backward()
    assert x.grad.dtype == weight.grad.dtype == bias.grad.dtype == torch.float32
    # The gradient of a sum passes the bf16 cast exactly: compare with the float32 gradients.
    xr, wr, br = (t.detach().clone().requires_grad_(True) for t in (x, w, b))
    fft_conv2d(xr, wr, br, padding=1, compression=compression).sum().backward()
    assert_rel_close(x.grad, xr.grad, 1e-2, "autocast grad input")
    assert_rel_close(weight.grad, wr.grad, 1e-2, "autocast grad weight")
    assert_rel_close(bias.grad, br.grad, 1e-2, "autocast grad bias")


# --------------------------------------------------------------------------------------------
# (f) errors
# --------------------------------------------------------------------------------------------


# A bad compression: tests/test_compression_edge.py (fft_conv1d/2d among every entry point).


def _error_message(fn, *args, **kwargs) -> str:
    with pytest.raises(ValueError) as info:
        fn(*args, **kwargs)
    return str(info.value)


def test_weight_of_wrong_rank():
    x = torch.randn(1, 3, 8, 8)
    with pytest.raises(ValueError, match="weight"):
        fft_conv2d(x, torch.randn(4, 3, 3))
    with pytest.raises(ValueError, match="weight"):
        fft_conv1d(x[:, :, 0], torch.randn(4, 3, 3, 3))


def test_input_of_wrong_rank():
    w = torch.randn(4, 3, 3, 3)
    with pytest.raises(ValueError, match="input"):
        fft_conv2d(torch.randn(1, 1, 3, 8, 8), w)
    with pytest.raises(ValueError, match="input"):
        fft_conv2d(torch.randn(8, 8), w)
    with pytest.raises(ValueError, match="input"):
        fft_conv1d(torch.randn(1, 3, 8, 8), w[:, :, 0])


def test_channel_mismatch_names_both_counts():
    message = _error_message(fft_conv2d, torch.randn(1, 4, 8, 8), torch.randn(5, 3, 3, 3))
    assert "3" in message and "4" in message and "channel" in message, message
    message = _error_message(fft_conv1d, torch.randn(2, 4, 8), torch.randn(5, 3, 3))
    assert "3" in message and "4" in message and "channel" in message, message


def test_groups_must_divide_out_channels():
    with pytest.raises(ValueError, match="groups=2"):
        fft_conv2d(torch.randn(1, 4, 8, 8), torch.randn(3, 2, 3, 3), groups=2)
    with pytest.raises(ValueError, match="groups"):
        fft_conv2d(torch.randn(1, 4, 8, 8), torch.randn(4, 4, 3, 3), groups=0)


def test_same_padding_with_stride():
    with pytest.raises(ValueError, match="same"):
        fft_conv2d(torch.randn(1, 3, 8, 8), torch.randn(4, 3, 3, 3), stride=2, padding="same")
    with pytest.raises(ValueError, match="same"):
        fft_conv1d(torch.randn(1, 3, 8), torch.randn(4, 3, 3), stride=2, padding="same")


def test_unknown_padding_string():
    with pytest.raises(ValueError, match="full"):
        fft_conv2d(torch.randn(1, 3, 8, 8), torch.randn(4, 3, 3, 3), padding="full")


def test_unknown_padding_mode():
    with pytest.raises(ValueError, match="padding_mode"):
        fft_conv2d(torch.randn(1, 3, 8, 8), torch.randn(4, 3, 3, 3), padding=1, padding_mode="mirror")


def test_kernel_bigger_than_padded_input():
    with pytest.raises(ValueError, match="Kernel size"):
        fft_conv2d(torch.randn(1, 3, 4, 4), torch.randn(4, 3, 5, 5))
    with pytest.raises(ValueError, match="Kernel size"):
        fft_conv2d(torch.randn(1, 3, 4, 8), torch.randn(4, 3, 3, 3), dilation=2)
    # ... but fits once padded.
    assert fft_conv2d(torch.randn(1, 3, 4, 4), torch.randn(4, 3, 5, 5), padding=1).shape == (1, 4, 2, 2)


def test_padding_mode_size_constraints():
    x, w = torch.randn(1, 3, 4, 4), torch.randn(4, 3, 3, 3)
    with pytest.raises(ValueError, match="reflect"):
        fft_conv2d(x, w, padding=4, padding_mode="reflect")
    with pytest.raises(ValueError, match="circular"):
        fft_conv2d(x, w, padding=5, padding_mode="circular")


def test_bad_bias_and_stride():
    x, w = torch.randn(1, 3, 8, 8), torch.randn(4, 3, 3, 3)
    with pytest.raises(ValueError, match="bias"):
        fft_conv2d(x, w, torch.randn(3))
    with pytest.raises(ValueError, match="stride"):
        fft_conv2d(x, w, stride=0)
    with pytest.raises(ValueError, match="padding"):
        fft_conv2d(x, w, padding=-1)
    with pytest.raises(ValueError, match="stride"):
        fft_conv2d(x, w, stride=(1, 2, 3))


# --------------------------------------------------------------------------------------------
# (g) CUDA
# --------------------------------------------------------------------------------------------


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_exact_and_autocast():
    saved = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        device = torch.device("cuda")
        for case in (EXPLICIT_CASES[0], EXPLICIT_CASES[3], EXPLICIT_CASES[11]):
            x, w, b, _ = case.tensors(torch.float64)
            x, w, b = x.to(device), w.to(device), b.to(device)
            out = fft_conv(case, x, w, b)
            assert out.device.type == "cuda"
            expected = torch_conv(case, x.cpu(), w.cpu(), b.cpu())
            assert_rel_close(out.cpu(), expected, 1e-9, f"cuda float64 {case}")
            out32 = fft_conv(case, x.float(), w.float(), b.float())
            assert_rel_close(out32.cpu(), expected.float(), 1e-4, f"cuda float32 {case}")
            banded = fft_conv(case, x, w, b, 0.5)
            expected_banded = banded_reference(case, x.cpu(), w.cpu(), b.cpu(), 0.5)
            assert_rel_close(banded.cpu(), expected_banded, 1e-9, "cuda c=0.5")

        x = torch.randn(2, 4, 16, 16, device=device)
        w = torch.randn(8, 4, 3, 3, device=device, requires_grad=True)
        with torch.autocast("cuda", dtype=torch.float16):
            out = fft_conv2d(x, w, padding=1, compression=0.5)
        assert out.dtype == torch.float16
        out.float().sum().backward()
        assert w.grad.dtype == torch.float32
        reference = fft_conv2d(x, w.detach(), padding=1, compression=0.5)
        assert_rel_close(out.float(), reference, 5e-3, "cuda autocast fp16")
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved


@pytest.mark.parametrize("algorithm", ["spectral", "spatial", "auto"])
@pytest.mark.parametrize("groups", [1, 2, 4])
@pytest.mark.parametrize("memory_lean", [False, True])
def test_backward_inside_autocast(algorithm, groups, memory_lean):
    """``loss.backward()`` called inside the autocast region (as users of plain PyTorch do): the
    backwards compute in float32 as they chose, not in autocast's dtype (grouped and depthwise
    convolutions failed with an ``out=`` dtype error). Compared with the backward outside."""
    g = torch.Generator().manual_seed(11)
    x = torch.randn(2, 4, 12, 11, generator=g)
    w, b = torch.randn(4, 4 // groups, 3, 3, generator=g), torch.randn(4, generator=g)
    grads = []
    for inside in (True, False):
        xi, wi, bi = (t.clone().requires_grad_(True) for t in (x, w, b))
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = fft_conv2d(
                xi, wi, bi, padding=1, groups=groups, compression=0.5,
                memory_lean=memory_lean, algorithm=algorithm,
            )  # fmt: skip
            loss = out.float().square().sum()
            if inside:
                loss.backward()
        if not inside:
            loss.backward()
        grads.append((xi.grad, wi.grad, bi.grad))
    for name, inside, outside in zip("xwb", *grads):
        assert inside.dtype == torch.float32
        assert_rel_close(inside, outside, 1e-6, f"grad {name} inside vs outside autocast")
