"""Memory-lean BatchNorm and ReLU with exact gradients (max-pool: :mod:`.pool`; convolution: :mod:`.conv`).

Each op computes what its ``torch.nn.functional`` counterpart computes and keeps for backward
only what the gradient needs, in the smallest exact form:

* ReLU keeps a bit mask of its output (1/32 of a float32 tensor) and publishes its output as
  ``relu(recipe of its input)`` when the input has a recipe (:mod:`.sources`).
* BatchNorm (training mode) keeps its input as the recipe the producing op published (a
  band-limited convolution's kept spectrum) or as itself, and publishes its output as
  ``affine(input, scale, shift)``.
* A native convolution (:mod:`.conv`) keeps its input as a recipe when it has one.
* Max-pooling (:mod:`.pool`) keeps the position of each maximum inside its window (one byte per output), not
  its input.

The backward passes call the same ATen kernels as autograd's (``convolution_backward``,
``native_batch_norm_backward``) on the recomputed tensors. These ops are meant for training
(``torch.is_grad_enabled()`` and something requiring grad); callers use the plain op otherwise.

Each op checks its arguments as its ``torch.nn.functional`` counterpart does, with the same
exception type and message, before any ATen kernel sees them (``native_batch_norm`` does not
check the sizes of its per-channel tensors). Each takes any memory layout (contiguous,
channels-last, strided) and returns the gradients of the functional op whatever the layouts;
max-pooling and a strided 1x1 convolution return a channels-last input's gradient channels-last.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable

from lightning_bandlimit.functional.autocast import autocast_off
from lightning_bandlimit.functional.lean.handoff import lookup, publish
from lightning_bandlimit.functional.lean.sources import Affine, Relu, Saved, Source, rebuild

__all__ = [
    "BatchNormFunction",
    "ReluFunction",
    "batch_parts",
    "lean_batch_norm",
    "lean_relu",
    "lean_wanted",
    "memory_format_of",
    "pack_mask",
    "unpack_mask",
]

_BIT_WEIGHTS: dict[torch.device, torch.Tensor] = {}
_UNPACK_TABLES: dict[tuple[torch.device, torch.dtype], torch.Tensor] = {}


def lean_wanted(input: torch.Tensor, *params: torch.Tensor | None) -> bool:
    """Whether a lean op pays off: gradients are being recorded for ``input`` or a parameter."""
    return torch.is_grad_enabled() and (
        input.requires_grad or any(p is not None and p.requires_grad for p in params)
    )


def batch_parts(n: int, parts: int = 8) -> list[slice]:
    """``range(n)`` in at most ``parts`` slices, so that a large temporary is made a part at a time."""
    step = max(1, -(-n // parts))
    return [slice(i, min(i + step, n)) for i in range(0, n, step)]


def _channels_last(t: torch.Tensor) -> bool:
    """Whether ``t`` is laid out channels-last (and not also contiguous, as when ``C == 1``)."""
    return t.dim() == 4 and not t.is_contiguous() and t.is_contiguous(memory_format=torch.channels_last)


def memory_format_of(t: torch.Tensor) -> torch.memory_format:
    return torch.channels_last if _channels_last(t) else torch.contiguous_format


def _bits(device: torch.device) -> torch.Tensor:
    if device not in _BIT_WEIGHTS:
        _BIT_WEIGHTS[device] = (2 ** torch.arange(8, dtype=torch.uint8)).to(device)
    return _BIT_WEIGHTS[device]


def _unpack_table(device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """``(256, 8)`` of ``dtype``: the bits of every byte, lowest first."""
    key = (device, dtype)
    if key not in _UNPACK_TABLES:
        bits = (torch.arange(256)[:, None] >> torch.arange(8)).bitwise_and(1)
        _UNPACK_TABLES[key] = bits.to(device=device, dtype=dtype)
    return _UNPACK_TABLES[key]


def pack_mask(mask: torch.Tensor) -> torch.Tensor:
    """Pack a bool tensor into bits: ``uint8`` of ``ceil(numel / 8)`` elements.

    Example:
        >>> m = torch.tensor([True, False, True, True, False, False, False, False, True])
        >>> pack_mask(m)
        tensor([13,  1], dtype=torch.uint8)
        >>> torch.equal(unpack_mask(pack_mask(m), m.shape), m)
        True
    """
    # Bits in the logical (row-major) order whatever the layout: a channels-last or strided mask
    # is copied, as reshape would.
    flat = mask.contiguous().view(-1)
    pad = -flat.numel() % 8
    if pad:
        flat = torch.cat([flat, flat.new_zeros(pad)])
    # bool is one byte of 0 or 1: reinterpret it, no copy
    return (flat.view(torch.uint8).view(-1, 8) * _bits(flat.device)).sum(1, dtype=torch.uint8)


def unpack_mask(packed: torch.Tensor, shape: Sequence[int], dtype: torch.dtype = torch.bool) -> torch.Tensor:
    """The inverse of :func:`pack_mask`: a tensor of ``shape`` (``dtype``: bool, or 0/1 values)."""
    numel = math.prod(shape)
    # index_select gathers whole table rows: several times faster than advanced indexing
    rows = _unpack_table(packed.device, dtype).index_select(0, packed.int())
    return rows.view(-1)[:numel].view(tuple(shape))


# --------------------------------------------------------------------------------------- ReLU
class ReluFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, input: torch.Tensor, inplace: bool) -> torch.Tensor:  # type: ignore[override]
        if inplace:
            out = input.relu_()
            ctx.mark_dirty(out)
        else:
            out = input.relu()
        ctx.shape = out.shape
        # Where the output is > 0 the gradient passes (NaN too, as in threshold_backward).
        ctx.save_for_backward(pack_mask(out.le(0).logical_not_()))
        return out

    @staticmethod
    @once_differentiable
    @autocast_off
    def backward(ctx, grad: torch.Tensor):  # type: ignore[override]
        (packed,) = ctx.saved_tensors
        per_sample = math.prod(ctx.shape[1:])
        if grad.dim() < 2 or per_sample % 8:
            return torch.ops.aten.threshold_backward(
                grad, unpack_mask(packed, ctx.shape, grad.dtype), 0
            ), None
        # 1.0 where the gradient passes, unpacked a part of the batch at a time: a small temporary
        grad_input = torch.empty_like(grad)
        for part in batch_parts(grad.shape[0]):
            bits = packed[part.start * per_sample // 8 : part.stop * per_sample // 8]
            passes = unpack_mask(bits, grad[part].shape, grad.dtype)
            grad_input[part] = torch.ops.aten.threshold_backward(grad[part], passes, 0)
        return grad_input, None


def lean_relu(input: torch.Tensor, inplace: bool = False) -> torch.Tensor:
    """``F.relu(input, inplace)`` that keeps a bit mask for backward, not its output.

    Args:
        input: any floating-point tensor.
        inplace: overwrite ``input``, as ``F.relu(..., inplace=True)``.

    Example:
        >>> x = torch.randn(4, 8, requires_grad=True)
        >>> lean_relu(x).sum().backward()
        >>> torch.equal(x.grad, (x > 0).float())
        True
    """
    found = lookup(input)
    if inplace and input._is_view():  # in-place on a view needs autograd's own view handling
        out = F.relu(input, inplace=True)
    else:
        out = ReluFunction.apply(input, inplace)
    if found is not None:
        source, tensors = found
        publish(out, Relu(source), tensors)
    return out


# --------------------------------------------------------------------------------- BatchNorm
def _check_batch_norm(
    input: torch.Tensor,
    running_mean: torch.Tensor | None,
    running_var: torch.Tensor | None,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
) -> None:
    """The size checks ``F.batch_norm`` makes before ``native_batch_norm``, which makes none.

    Raises:
        RuntimeError: as ``F.batch_norm``, if a per-channel tensor has not ``input.shape[1]``
            elements (``native_batch_norm`` would read or write past its end).
    """
    channels = input.shape[1]
    for name, t in (
        ("running_mean", running_mean),
        ("running_var", running_var),
        ("weight", weight),
        ("bias", bias),
    ):
        if t is not None and t.numel() != channels:
            raise RuntimeError(f"{name} should contain {channels} elements not {t.numel()}")


class BatchNormFunction(torch.autograd.Function):
    @staticmethod
    def forward(  # type: ignore[override]
        ctx,
        input: torch.Tensor,
        weight: torch.Tensor | None,
        bias: torch.Tensor | None,
        running_mean: torch.Tensor | None,
        running_var: torch.Tensor | None,
        momentum: float,
        eps: float,
        source: Source,
        *source_tensors: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        _check_batch_norm(input, running_mean, running_var, weight, bias)
        # ATen's own kernel: the statistics, running-statistics update and output of F.batch_norm.
        # Devices and dtypes are checked there (by the dispatcher and the kernel), as for F.
        out, mean, invstd = torch.native_batch_norm(
            input, weight, bias, running_mean, running_var, True, momentum, eps
        )
        compute = mean.dtype
        scale = invstd if weight is None else invstd * weight.to(compute)
        shift = -mean * scale if bias is None else bias.to(compute) - mean * scale
        ctx.source, ctx.eps, ctx.dtype = source, eps, input.dtype
        ctx.save_for_backward(weight, mean, invstd, *source_tensors)
        ctx.mark_non_differentiable(scale, shift)
        return out, scale, shift

    @staticmethod
    @once_differentiable
    @autocast_off
    def backward(ctx, grad: torch.Tensor, *_: torch.Tensor):  # type: ignore[override]
        weight, mean, invstd, *kept = ctx.saved_tensors
        need_x, need_w, need_b = ctx.needs_input_grad[:3]
        compute = mean.dtype
        shape = (1, -1) + (1,) * (grad.dim() - 2)
        dims = [0, *range(2, grad.dim())]
        y = rebuild(ctx.source, kept)
        if not ctx.source.fresh:
            # The input is kept as itself: nothing to overwrite, ATen's fused kernel is fastest.
            grad_input, grad_w, grad_b = torch.ops.aten.native_batch_norm_backward(
                grad, y, weight, None, None, mean, invstd, True, ctx.eps, [need_x, need_w, need_b]
            )
            return (grad_input, grad_w, grad_b, *(None for _ in range(5 + len(kept))))
        # x_hat overwrites the recomputed input when that is a new tensor: one activation-sized
        # buffer fewer than autograd's own BatchNorm backward at the layer being differentiated.
        fresh = ctx.source.fresh and y.dtype == compute
        x_hat = y.to(compute) if fresh else y.to(compute, copy=True)
        x_hat.sub_(mean.view(shape)).mul_(invstd.view(shape))
        g = grad.to(compute)
        grad_b = g.sum(dims)
        grad_w = _channel_dot(g, x_hat)
        grad_input = None
        if need_x:
            count = g.numel() // g.shape[1]
            scale = invstd if weight is None else invstd * weight.to(compute)
            grad_input = x_hat.mul_((grad_w / -count).view(shape)).add_(g).sub_((grad_b / count).view(shape))
            grad_input = grad_input.mul_(scale.view(shape)).to(ctx.dtype)
        return (
            grad_input,
            grad_w.to(weight.dtype) if need_w else None,
            grad_b.to(weight.dtype if weight is not None else compute) if need_b else None,
            *(None for _ in range(5 + len(kept))),
        )


def _channel_dot(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``(a * b).sum(all dims but 1)``, an eighth of the batch at a time (small temporaries)."""
    dims = [0, *range(2, a.dim())]
    return sum((a[part] * b[part]).sum(dims) for part in batch_parts(a.shape[0]))  # type: ignore[return-value]


def lean_batch_norm(
    input: torch.Tensor,
    running_mean: torch.Tensor | None,
    running_var: torch.Tensor | None,
    weight: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    momentum: float = 0.1,
    eps: float = 1e-5,
) -> torch.Tensor:
    """``F.batch_norm(..., training=True)`` that keeps its input in the smallest exact form.

    The output, the statistics and the running-statistics update come from ATen's
    ``native_batch_norm``, the kernel ``F.batch_norm`` runs on the CPU; the output is offered to
    the next op as ``affine(input, scale, shift)``, equal to it to round-off.

    Args:
        input: ``(N, C, *)``.
        running_mean, running_var: ``(C,)`` buffers updated in place, or ``None``.
        weight, bias: optional ``(C,)`` affine parameters.
        momentum: the running-statistics update factor.
        eps: added to the variance.

    Raises:
        ValueError: if there is only one value per channel (as ``F.batch_norm``).
        RuntimeError: if ``running_mean``, ``running_var``, ``weight`` or ``bias`` has not
            ``C`` elements (as ``F.batch_norm``), or devices or dtypes do not match.

    Example:
        >>> x = torch.randn(8, 3, 5, 5, requires_grad=True)
        >>> out = lean_batch_norm(x, None, None)
        >>> torch.allclose(out, F.batch_norm(x, None, None, training=True), atol=1e-5)
        True
    """
    if input.dim() < 2 or input.numel() // max(1, input.shape[1]) <= 1:
        raise ValueError(
            f"Expected more than 1 value per channel when training, got input size {list(input.shape)}"
        )
    # F.batch_norm takes any tensor of C elements as a per-channel one: (C,) views of them
    weight = weight if weight is None or weight.dim() == 1 else weight.reshape(-1)
    bias = bias if bias is None or bias.dim() == 1 else bias.reshape(-1)
    found = lookup(input)
    source, tensors = found if found is not None else (Saved(), (input,))
    out, scale, shift = BatchNormFunction.apply(
        input, weight, bias, running_mean, running_var, momentum, eps, source, *tensors
    )
    publish(out, Affine(source, out.dtype), (*tensors, scale, shift))
    return out
