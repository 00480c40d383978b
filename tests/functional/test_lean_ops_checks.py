"""The memory-lean ops check their arguments as ``torch.nn.functional`` does, and take any layout.

Invalid arguments raise what the functional op raises (type and message) before any ATen kernel
runs: ``native_batch_norm`` fed running statistics of the wrong size corrupts memory. Channels-last,
transposed and sliced inputs give the functional op's outputs and gradients (float64, to
round-off).
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from lightning_bandlimit import bandlimit
from lightning_bandlimit.functional.lean.conv import lean_conv
from lightning_bandlimit.functional.lean.ops import lean_batch_norm, lean_relu, pack_mask, unpack_mask
from lightning_bandlimit.functional.lean.pool import lean_max_pool2d
from lightning_bandlimit.layers.lean import LeanModule

LAYOUTS = ["contiguous", "channels_last", "transposed", "sliced"]


def _layout(x: torch.Tensor, layout: str) -> torch.Tensor:
    """A tensor equal to the 4-D ``x``, laid out as ``layout``."""
    if layout == "contiguous":
        out = x.contiguous()
    elif layout == "channels_last":
        out = x.contiguous(memory_format=torch.channels_last)
    elif layout == "transposed":
        out = x.transpose(-1, -2).contiguous().transpose(-1, -2)
    else:  # every other column of a wider tensor
        wide = x.new_zeros(*x.shape[:-1], 2 * x.shape[-1])
        wide[..., ::2] = x
        out = wide[..., ::2]
    assert torch.equal(out, x)
    if min(x.shape[1:]) > 1:  # else (e.g. a 1x1 weight) channels-last is contiguous too
        assert (layout == "contiguous") == out.is_contiguous()
    return out


def _leaf(x: torch.Tensor, layout: str) -> torch.Tensor:
    return _layout(x, layout).detach().requires_grad_()


def _raised(fn: Callable[[], object]) -> Exception:
    with pytest.raises(Exception) as info:
        fn()
    return info.value


def _raises_as(expected: Exception, fn: Callable[[], object]) -> None:
    """``fn()`` raises ``expected``'s type with ``expected``'s message."""
    with pytest.raises(type(expected), match=re.escape(str(expected))):
        fn()


# ------------------------------------------------------------------------------ the checks
C = 1024


def _bn_args(**wrong: int) -> dict[str, torch.Tensor]:
    sizes = {"running_mean": C, "running_var": C, "weight": C, "bias": C, **wrong}
    return {
        "running_mean": torch.zeros(sizes["running_mean"]),
        "running_var": torch.ones(sizes["running_var"]),
        "weight": torch.ones(sizes["weight"], requires_grad=True),
        "bias": torch.zeros(sizes["bias"], requires_grad=True),
    }


@pytest.mark.parametrize(
    "wrong",
    [
        {"running_mean": 992},
        {"running_var": 992},
        {"weight": 992},
        {"bias": 2000},
        {"running_mean": 0, "running_var": 992, "weight": 1, "bias": 2000},
        {"weight": 1},
    ],
)
def test_batch_norm_rejects_wrong_sizes_as_functional(wrong: dict[str, int]) -> None:
    x = torch.randn(4, C, 3, 3, requires_grad=True)
    expected = _raised(lambda: F.batch_norm(x, training=True, **_bn_args(**wrong)))
    assert isinstance(expected, RuntimeError)
    args = _bn_args(**wrong)
    _raises_as(expected, lambda: lean_batch_norm(x, **args))
    # Raised before the kernel: the running statistics are untouched.
    assert not args["running_mean"].any() and args["running_var"].eq(1).all()


def test_batch_norm_running_mean_message() -> None:
    x = torch.randn(2, C, 2, 2, requires_grad=True)
    args = _bn_args(running_mean=992)
    with pytest.raises(RuntimeError, match="running_mean should contain 1024 elements not 992"):
        lean_batch_norm(x, **args)


def test_batch_norm_wrong_size_without_running_statistics() -> None:
    x = torch.randn(4, 6, 3, 3, requires_grad=True)
    weight = torch.ones(5, requires_grad=True)
    expected = _raised(lambda: F.batch_norm(x, None, None, weight, training=True))
    _raises_as(expected, lambda: lean_batch_norm(x, None, None, weight))


def test_batch_norm_takes_any_tensor_of_c_elements_as_functional() -> None:
    """F.batch_norm's forward takes a (2, 3) weight for 6 channels; its backward then fails, the
    lean one returns the gradients of the (6,) weight in the weight's shape."""
    torch.manual_seed(0)
    x = torch.randn(4, 6, 3, 3, dtype=torch.float64)
    weight = torch.rand(2, 3, dtype=torch.float64)
    bias = torch.randn(3, 2, dtype=torch.float64)
    g = torch.randn(4, 6, 3, 3, dtype=torch.float64)
    results = []
    for op, shaped in ((F.batch_norm, False), (lean_batch_norm, True)):
        xi = x.clone().requires_grad_()
        w = (weight if shaped else weight.reshape(-1)).clone().requires_grad_()
        b = (bias if shaped else bias.reshape(-1)).clone().requires_grad_()
        rm, rv = torch.zeros(6, dtype=torch.float64), torch.ones(6, dtype=torch.float64)
        kwargs = {"training": True} if op is F.batch_norm else {}
        out = op(xi, rm, rv, w, b, **kwargs)
        if shaped:
            torch.testing.assert_close(out, F.batch_norm(x, None, None, weight, bias, training=True))
        out.backward(g)
        assert w.grad is not None and b.grad is not None
        results.append((out, xi.grad, w.grad.reshape(-1), b.grad.reshape(-1), rm, rv))
    for lean, plain in zip(results[1], results[0]):
        torch.testing.assert_close(lean, plain)


@pytest.mark.parametrize(
    "args",
    [
        {"kernel_size": 3, "stride": 1, "padding": 2},
        {"kernel_size": 3, "stride": 1, "padding": 3, "dilation": 2},
        {"kernel_size": 0},
        {"kernel_size": 2, "stride": 0},
        {"kernel_size": 2, "stride": -1},
        {"kernel_size": 2, "dilation": 0},
        {"kernel_size": 2, "padding": -1},
        {"kernel_size": (2, 2, 2)},
        {"kernel_size": 2, "stride": (1, 1, 1)},
        {"kernel_size": 2, "padding": (0, 0, 0)},
        {"kernel_size": 2, "dilation": (1, 1, 1)},
        {"kernel_size": 9},
        {"kernel_size": 20},
    ],
)
def test_max_pool_rejects_bad_arguments_as_functional(args: dict[str, object]) -> None:
    x = torch.randn(2, 3, 8, 8, requires_grad=True)
    expected = _raised(lambda: F.max_pool2d(x, **args))
    assert isinstance(expected, RuntimeError)
    _raises_as(expected, lambda: lean_max_pool2d(x, **args))


@pytest.mark.parametrize("shape", [(8,), (1, 1, 2, 8, 8), (2, 0, 8, 8)])
def test_max_pool_rejects_bad_inputs_as_functional(shape: tuple[int, ...]) -> None:
    x = torch.randn(*shape, requires_grad=True)
    expected = _raised(lambda: F.max_pool2d(x, 2))
    _raises_as(expected, lambda: lean_max_pool2d(x, 2))


def test_max_pool_empty_batch() -> None:
    x = torch.randn(0, 3, 8, 8, requires_grad=True)
    out = lean_max_pool2d(x, 2)
    assert out.shape == F.max_pool2d(x, 2).shape
    out.sum().backward()
    assert x.grad is not None and x.grad.shape == x.shape


@pytest.mark.parametrize(
    ("weight_shape", "stride", "groups", "bias"),
    [
        ((6, 3, 3, 3), (1, 1), 1, None),  # channels
        ((6, 3, 1, 1), (2, 2), 1, None),  # channels, subsampled 1x1
        ((6, 4, 1, 1), (2, 2), 2, None),  # channels with groups
        ((5, 2, 1, 1), (2, 2), 2, None),  # output channels not divisible by groups
        ((6, 4, 1, 1), (2, 0), 1, None),  # non-positive stride
        ((6, 4, 1, 1), (2, -1), 1, None),
        ((6, 4, 1, 1), (2, 2, 2), 1, None),  # stride of the wrong length
        ((6, 4, 1, 1), (2, 2), 1, 5),  # bias size
        ((6, 4, 1, 1), (2, 2), 0, None),  # groups
    ],
)
def test_conv_rejects_bad_arguments_as_functional(
    weight_shape: tuple[int, ...], stride: tuple[int, ...], groups: int, bias: int | None
) -> None:
    x = torch.randn(2, 4, 9, 9, requires_grad=True)
    w = torch.randn(*weight_shape, requires_grad=True)
    b = None if bias is None else torch.randn(bias, requires_grad=True)
    expected = _raised(lambda: F.conv2d(x, w, b, stride, 0, 1, groups))
    assert isinstance(expected, RuntimeError)
    _raises_as(expected, lambda: lean_conv(x, w, b, stride, (0, 0), (1, 1), groups))


def test_conv_rejects_mixed_dtypes_as_functional() -> None:
    x = torch.randn(2, 4, 9, 9, dtype=torch.float64, requires_grad=True)
    w = torch.randn(6, 4, 1, 1, requires_grad=True)
    expected = _raised(lambda: F.conv2d(x, w, None, 2))
    _raises_as(expected, lambda: lean_conv(x, w, None, (2, 2), (0, 0), (1, 1), 1))


@pytest.mark.parametrize("stride", [(2,), (3,)])
def test_conv_single_stride_for_all_dims(stride: tuple[int]) -> None:
    torch.manual_seed(0)
    x = torch.randn(2, 4, 9, 9, dtype=torch.float64)
    w = torch.randn(6, 4, 1, 1, dtype=torch.float64)
    _assert_same(
        lambda x, w: F.conv2d(x, w, None, stride),
        lambda x, w: lean_conv(x, w, None, stride, (0,), (1,), 1),
        [x, w],
    )


def test_conv_unbatched_is_the_plain_op() -> None:
    torch.manual_seed(0)
    x = torch.randn(4, 9, 9, dtype=torch.float64)
    w = torch.randn(6, 4, 1, 1, dtype=torch.float64)
    _assert_same(
        lambda x, w: F.conv2d(x, w, None, 2),
        lambda x, w: lean_conv(x, w, None, (2, 2), (0, 0), (1, 1), 1),
        [x, w],
    )


# ---------------------------------------------------------------------------------- layouts
def _assert_same(
    plain: Callable[..., torch.Tensor],
    lean: Callable[..., torch.Tensor],
    inputs: list[torch.Tensor],
    layouts: list[str] | None = None,
    grad_layout: str = "contiguous",
) -> None:
    """``lean`` and ``plain`` of ``inputs`` (laid out as ``layouts``) give the same output and
    gradients, for an upstream gradient laid out as ``grad_layout``."""
    layouts = layouts or ["contiguous"] * len(inputs)
    results = []
    for op in (plain, lean):
        leaves = [
            _leaf(t, lay) if t.dim() == 4 else t.clone().requires_grad_() for t, lay in zip(inputs, layouts)
        ]
        out = op(*leaves)
        g = torch.randn(out.shape, dtype=out.dtype, generator=torch.Generator().manual_seed(2))
        out.backward(_layout(g, grad_layout) if g.dim() == 4 else g)
        results.append((out.detach(), [t.grad for t in leaves]))
    (out_p, grads_p), (out_l, grads_l) = results
    torch.testing.assert_close(out_l, out_p, rtol=1e-12, atol=1e-12)
    for g_l, g_p in zip(grads_l, grads_p):
        torch.testing.assert_close(g_l, g_p, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("shape", [(3, 4, 6, 5), (3, 3, 5, 7)])  # per-sample mask bits: whole bytes or not
def test_relu_layouts(layout: str, shape: tuple[int, ...]) -> None:
    torch.manual_seed(0)
    x = torch.randn(*shape, dtype=torch.float64)
    _assert_same(F.relu, lean_relu, [x], [layout], grad_layout=layout)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("shape", [(3, 4, 6, 5), (3, 3, 5, 7)])
def test_relu_inplace_layouts(layout: str, shape: tuple[int, ...]) -> None:
    torch.manual_seed(0)
    x = torch.randn(*shape, dtype=torch.float64)

    def inplace(op: Callable[..., torch.Tensor]) -> Callable[[torch.Tensor], torch.Tensor]:
        def run(x: torch.Tensor) -> torch.Tensor:
            y = x * 1.0  # a new tensor in x's layout (a view only where x is not dense)
            out = op(y, inplace=True)
            assert out is y
            return out

        return run

    _assert_same(inplace(F.relu), inplace(lean_relu), [x], [layout], grad_layout=layout)


def test_pack_mask_any_layout() -> None:
    torch.manual_seed(0)
    mask = torch.randn(3, 4, 5, 7) > 0
    for layout in LAYOUTS:
        m = _layout(mask, layout)
        assert torch.equal(pack_mask(m), pack_mask(mask))
        assert torch.equal(unpack_mask(pack_mask(m), m.shape), mask)
    strided = torch.randn(37) > 0
    assert torch.equal(unpack_mask(pack_mask(strided[::3]), (13,)), strided[::3])


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("affine", [True, False])
def test_batch_norm_layouts(layout: str, affine: bool) -> None:
    torch.manual_seed(0)
    x = torch.randn(4, 3, 5, 6, dtype=torch.float64) * 2 + 1
    params = [torch.rand(3, dtype=torch.float64) + 0.5, torch.randn(3, dtype=torch.float64)] if affine else []
    stats = []

    def op(fn: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
        def run(x: torch.Tensor, *params: torch.Tensor) -> torch.Tensor:
            rm, rv = torch.zeros(3, dtype=torch.float64), torch.ones(3, dtype=torch.float64)
            stats.append((rm, rv))
            if fn is F.batch_norm:
                return F.batch_norm(x, rm, rv, *params, training=True)
            return lean_batch_norm(x, rm, rv, *params)

        return run

    _assert_same(op(F.batch_norm), op(lean_batch_norm), [x, *params], [layout, "", ""], grad_layout=layout)
    for lean, plain in zip(stats[1], stats[0]):
        torch.testing.assert_close(lean, plain)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_batch_norm_relu_conv_chain_layouts(layout: str) -> None:
    """A BatchNorm input and a conv input kept as recipes (rebuilt, the fresh backward path)."""
    torch.manual_seed(0)
    x = torch.randn(4, 3, 6, 6, dtype=torch.float64) * 2 + 1
    w1, b1 = torch.rand(3, dtype=torch.float64) + 0.5, torch.randn(3, dtype=torch.float64)
    w2, b2 = torch.rand(3, dtype=torch.float64) + 0.5, torch.randn(3, dtype=torch.float64)
    conv = torch.randn(5, 3, 1, 1, dtype=torch.float64)

    def plain(
        x: torch.Tensor,
        w1: torch.Tensor,
        b1: torch.Tensor,
        w2: torch.Tensor,
        b2: torch.Tensor,
        c: torch.Tensor,
    ) -> torch.Tensor:
        y = F.relu(F.batch_norm(x, None, None, w1, b1, training=True))
        return F.conv2d(F.relu(F.batch_norm(y, None, None, w2, b2, training=True)), c, None, 2)

    def lean(
        x: torch.Tensor,
        w1: torch.Tensor,
        b1: torch.Tensor,
        w2: torch.Tensor,
        b2: torch.Tensor,
        c: torch.Tensor,
    ) -> torch.Tensor:
        y = lean_relu(lean_batch_norm(x, None, None, w1, b1))
        return lean_conv(
            lean_relu(lean_batch_norm(y, None, None, w2, b2)), c, None, (2, 2), (0, 0), (1, 1), 1
        )

    c_layout = "channels_last" if layout == "channels_last" else "contiguous"
    _assert_same(
        plain, lean, [x, w1, b1, w2, b2, conv], [layout, "", "", "", "", c_layout], grad_layout=layout
    )


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize(
    ("kernel", "stride", "padding", "dilation", "ceil_mode"),
    [(2, 2, 0, 1, False), (3, 2, 1, 1, False), (3, 2, 1, 2, True), ((3, 2), (2, 1), (1, 0), 1, True)],
)
def test_max_pool_layouts(
    layout: str, kernel: object, stride: object, padding: object, dilation: object, ceil_mode: bool
) -> None:
    torch.manual_seed(0)
    x = torch.randn(2, 3, 9, 10, dtype=torch.float64)
    args = (kernel, stride, padding, dilation, ceil_mode)
    for grad_layout in ("contiguous", layout):
        _assert_same(
            lambda x: F.max_pool2d(x, *args), lambda x: lean_max_pool2d(x, *args), [x], [layout], grad_layout
        )


def test_max_pool_gradient_keeps_channels_last() -> None:
    x = torch.randn(2, 3, 8, 8).contiguous(memory_format=torch.channels_last).requires_grad_()
    out = lean_max_pool2d(x, 3, 2, 1)
    (grad,) = torch.autograd.grad(out, x, torch.ones_like(out))
    assert grad.is_contiguous(memory_format=torch.channels_last)


def test_max_pool_unbatched() -> None:
    torch.manual_seed(0)
    x = torch.randn(3, 9, 10, dtype=torch.float64)
    _assert_same(lambda x: F.max_pool2d(x, 3, 2, 1), lambda x: lean_max_pool2d(x, 3, 2, 1), [x])
    _assert_same(
        lambda x: F.max_pool2d(x.transpose(1, 2), 2), lambda x: lean_max_pool2d(x.transpose(1, 2), 2), [x]
    )


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize(
    ("weight_shape", "stride", "padding", "groups"),
    [
        ((6, 4, 3, 3), (1, 1), (1, 1), 1),
        ((6, 4, 3, 3), (2, 2), (1, 1), 1),
        ((6, 4, 1, 1), (2, 2), (0, 0), 1),  # subsampled: keeps the pixels it reads
        ((6, 2, 1, 1), (2, 3), (0, 0), 2),
        ((6, 4, 1, 1), (1, 1), (0, 0), 1),
    ],
)
@pytest.mark.parametrize("bias", [True, False])
def test_conv_layouts(
    layout: str,
    weight_shape: tuple[int, ...],
    stride: tuple[int, int],
    padding: tuple[int, int],
    groups: int,
    bias: bool,
) -> None:
    torch.manual_seed(0)
    x = torch.randn(2, 4, 9, 11, dtype=torch.float64)
    w = torch.randn(*weight_shape, dtype=torch.float64)
    inputs = [x, w] + ([torch.randn(weight_shape[0], dtype=torch.float64)] if bias else [])
    w_layout = "channels_last" if layout == "channels_last" else "contiguous"

    def plain(x: torch.Tensor, w: torch.Tensor, *b: torch.Tensor) -> torch.Tensor:
        return F.conv2d(x, w, b[0] if b else None, stride, padding, 1, groups)

    def lean(x: torch.Tensor, w: torch.Tensor, *b: torch.Tensor) -> torch.Tensor:
        return lean_conv(x, w, b[0] if b else None, stride, padding, (1, 1), groups)

    for grad_layout in ("contiguous", layout):
        _assert_same(plain, lean, inputs, [layout, w_layout, ""], grad_layout)


def test_strided_pointwise_conv_gradient_keeps_channels_last() -> None:
    x = torch.randn(2, 4, 8, 8).contiguous(memory_format=torch.channels_last).requires_grad_()
    w = torch.randn(6, 4, 1, 1)
    out = lean_conv(x, w, None, (2, 2), (0, 0), (1, 1), 1)
    assert out.is_contiguous(memory_format=torch.channels_last)
    (grad,) = torch.autograd.grad(out, x, torch.ones_like(out))
    assert grad.is_contiguous(memory_format=torch.channels_last)


# ------------------------------------------------------------------------------- end to end
@pytest.mark.parametrize("inplace", [False, True])
@pytest.mark.parametrize("size", [4, 16])  # 4: full bands, native convolutions keep channels-last
def test_band_limited_model_channels_last_same_gradients(inplace: bool, size: int) -> None:
    torch.manual_seed(0)
    base = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1),
        nn.BatchNorm2d(8),
        nn.ReLU(inplace=inplace),
        nn.MaxPool2d(2),
        nn.Conv2d(8, 8, 3, padding=1),
        nn.BatchNorm2d(8),
        nn.ReLU(inplace=inplace),
        nn.Conv2d(8, 4, 1, stride=2),
    ).double()
    x = torch.randn(4, 3, size, size, dtype=torch.float64)
    results = []
    for memory_format, lean in (
        (torch.contiguous_format, False),
        (torch.contiguous_format, True),
        (torch.channels_last, True),
    ):
        model = bandlimit(copy.deepcopy(base), 0.5, memory_lean=lean).to(memory_format=memory_format)
        channels_last_inputs = []
        if lean:
            lean_modules = [m for i, m in enumerate(model) if i not in (0, 4)]  # all but the 3x3 convs
            assert all(isinstance(m, LeanModule) for m in lean_modules)
            for m in lean_modules:
                m.register_forward_pre_hook(
                    lambda _, args: channels_last_inputs.append(
                        args[0].is_contiguous(memory_format=torch.channels_last)
                        and not args[0].is_contiguous()
                    )
                )
        model.train()
        out = model(x.contiguous(memory_format=memory_format))
        (out.square().mean() + out.mean()).backward()
        results.append((out.detach(), [p.grad for p in model.parameters()], list(model.buffers())))
        if memory_format == torch.channels_last and size == 4:
            assert all(channels_last_inputs)  # what this test is about: lean ops on channels-last
    reference = results[0]
    for out, grads, buffers in results[1:]:
        torch.testing.assert_close(out, reference[0], rtol=1e-10, atol=1e-12)
        for g, g_ref in zip(grads, reference[1]):
            torch.testing.assert_close(g, g_ref, rtol=1e-8, atol=1e-12)
        for b, b_ref in zip(buffers, reference[2]):
            torch.testing.assert_close(b, b_ref, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("name", ["vgg11_bn", "shufflenet_v2_x0_5", "squeezenet1_1"])
def test_torchvision_channels_last_backward(name: str) -> None:
    torchvision = pytest.importorskip("torchvision")
    torch.manual_seed(0)
    model = bandlimit(getattr(torchvision.models, name)(num_classes=10), 0.5)
    model = model.to(memory_format=torch.channels_last).train()
    x = torch.randn(2, 3, 64, 64).contiguous(memory_format=torch.channels_last)
    model(x).sum().backward()
    assert all(p.grad is not None and p.grad.isfinite().all() for p in model.parameters() if p.requires_grad)
