"""``torch.compile`` support: the band-limited convolution as one opaque custom op.

Inside a compiled region a band-limited layer calls :func:`compiled_band_limited_conv` instead of
the eager dispatch of :mod:`.fft_conv`: the frequency-domain math (cached DFT plans, batch
slices, ``out=`` matrix products) runs eagerly inside the op ``lightning_bandlimit::conv``, which
``torch.compile`` sees as a single node with a fake (shape-only) implementation and a backward
op. So a band-limited model compiles without graph breaks (``fullgraph=True`` works) and, since
the compression reaches the op as a tensor, one compiled graph serves every compression above 0.

Memory-lean training is not traceable (its ops hand recipes from one op to the next through a
registry of Python objects): in a compiled region the lean modules run their plain forward and
the op keeps the layer's input for backward, as ``nn.Conv2d`` does. The results and gradients
are those of the eager model (to round-off); :func:`warn_memory_lean_compiled` warns once.

The backward op recomputes the forward of the chosen algorithm (to rebuild what its backward
reads), so a compiled training step costs one more band-limited forward per layer than the
eager one.
"""

import warnings
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F

from lightning_bandlimit.functional.band_projection import projection_plan_for
from lightning_bandlimit.functional.fft_conv import auto_algorithm, band_limited_conv
from lightning_bandlimit.functional.lean.conv import conv_dtype
from lightning_bandlimit.functional.spatial_conv import KEEP_COEFFICIENTS, SpatialConvFunction
from lightning_bandlimit.functional.spectral_kernel import KEEP_SPECTRUM, FFTConvFunction, as_2d
from lightning_bandlimit.functional.spectrum_split import input_plan

__all__ = ["compiled_band_limited_conv", "warn_memory_lean_compiled"]

_WARNED: set[str] = set()


def warn_memory_lean_compiled() -> None:
    """Warn, once per process, that ``torch.compile`` runs memory-lean layers as plain ones."""
    if "memory_lean" not in _WARNED:
        _WARNED.add("memory_lean")
        warnings.warn(
            "torch.compile: memory-lean training (memory_lean=True) cannot be traced; inside the "
            "compiled model the band-limited and lean layers keep for backward what the plain "
            "layers keep (same results and gradients). Run the model eagerly for the memory "
            "saving, or pass memory_lean=False to bandlimit() to silence this warning.",
            stacklevel=2,
        )


class _Context:
    """What an autograd ``Function``'s ``forward`` and ``backward`` read of ``ctx``, without autograd."""

    def __init__(self, needs_input_grad: tuple[bool, ...]) -> None:
        self.needs_input_grad = needs_input_grad
        self.saved_tensors: tuple[torch.Tensor, ...] = ()

    def save_for_backward(self, *tensors: torch.Tensor) -> None:
        self.saved_tensors = tensors

    def mark_non_differentiable(self, *tensors: torch.Tensor) -> None:
        pass


def _operands(
    input: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, out_dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """The operands in one dtype, as the eager path computes them under autocast (float32)."""
    dtypes = {input.dtype, weight.dtype, out_dtype} | ({bias.dtype} if bias is not None else set())
    if len(dtypes) == 1:
        return input, weight, bias
    return input.float(), weight.float(), None if bias is None else bias.float()


def _padding(padding: Sequence[int], padding_str: str) -> Sequence[int] | str:
    return padding_str if padding_str else list(padding)


@torch.library.custom_op(
    "lightning_bandlimit::conv",
    mutates_args=(),
    schema="(Tensor input, Tensor weight, Tensor? bias, Tensor compression, int[] stride, "
    "int[] padding, str padding_str, int[] dilation, int groups, str padding_mode, "
    "int spatial_dims, str algorithm, bool[] grads, ScalarType out_dtype, bool memory_lean) "
    "-> (Tensor, Tensor)",
)
def _conv_op(
    input: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    compression: torch.Tensor,
    stride: Sequence[int],
    padding: Sequence[int],
    padding_str: str,
    dilation: Sequence[int],
    groups: int,
    padding_mode: str,
    spatial_dims: int,
    algorithm: str,
    grads: Sequence[bool],
    out_dtype: torch.dtype,
    memory_lean: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    if memory_lean:
        warn_memory_lean_compiled()
    with torch.autocast(input.device.type, enabled=False):
        x, w, b = _operands(input, weight, bias, out_dtype)
        out, band = band_limited_conv(
            x,
            w,
            b,
            list(stride),
            _padding(padding, padding_str),
            list(dilation),
            groups,
            padding_mode,
            float(compression),
            spatial_dims,
            algorithm=algorithm,
            grads=(grads[0], grads[1]),
        )
    return out.to(out_dtype).contiguous(), torch.tensor(band.compression, dtype=torch.float64)


@_conv_op.register_fake
def _conv_fake(
    input: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    compression: torch.Tensor,
    stride: Sequence[int],
    padding: Sequence[int],
    padding_str: str,
    dilation: Sequence[int],
    groups: int,
    padding_mode: str,
    spatial_dims: int,
    algorithm: str,
    grads: Sequence[bool],
    out_dtype: torch.dtype,
    memory_lean: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    # Non-zero padding modes pad as zeros do: the native convolution's output shape is the layer's.
    conv = F.conv1d if spatial_dims == 1 else F.conv2d
    shape = conv(
        input.to(out_dtype),
        weight.to(out_dtype),
        None,
        stride,
        _padding(padding, padding_str),
        dilation,
        groups,
    ).shape
    return input.new_empty(shape, dtype=out_dtype), compression.new_empty((), dtype=torch.float64)


@torch.library.custom_op(
    "lightning_bandlimit::conv_backward",
    mutates_args=(),
    schema="(Tensor grad, Tensor input, Tensor weight, Tensor? bias, Tensor compression, int[] stride, "
    "int[] padding, str padding_str, int[] dilation, int groups, str padding_mode, "
    "int spatial_dims, str algorithm, bool[] grads, ScalarType out_dtype, bool[] output_mask) "
    "-> (Tensor, Tensor, Tensor)",
)
def _conv_backward_op(
    grad: torch.Tensor,
    input: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    compression: torch.Tensor,
    stride: Sequence[int],
    padding: Sequence[int],
    padding_str: str,
    dilation: Sequence[int],
    groups: int,
    padding_mode: str,
    spatial_dims: int,
    algorithm: str,
    grads: Sequence[bool],
    out_dtype: torch.dtype,
    output_mask: Sequence[bool],
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    need_x, need_w, need_b = output_mask
    need_b = need_b and bias is not None
    with torch.autocast(input.device.type, enabled=False):
        x, w, b = _operands(input, weight, bias, out_dtype)
        unbatched = x.dim() == spatial_dims + 1
        x, g = (x.unsqueeze(0), grad.unsqueeze(0)) if unbatched else (x, grad)
        g = g.to(x.dtype)
        pad = _padding(padding, padding_str)
        plan = input_plan(
            x, w, b, stride, pad, dilation, groups, padding_mode, float(compression), spatial_dims, algorithm
        )
        geometry = plan.geometry
        if algorithm == "auto":  # the one band_limited_conv chose in the forward pass
            algorithm = auto_algorithm(plan, padding_mode, x, w, (grads[0], grads[1]))
        mask = (need_x, need_w, need_b)
        if algorithm == "native":
            sd = spatial_dims
            gx, gw, gb = torch.ops.aten.convolution_backward(
                g,
                x,
                w,
                [w.shape[0]] if need_b else None,
                list(geometry.stride[2 - sd :]),
                [p for p, _ in geometry.pads[2 - sd :]],
                list(geometry.dilation[2 - sd :]),
                False,
                [0] * sd,
                groups,
                list(mask),
            )
        elif algorithm == "spatial":
            projection = projection_plan_for(geometry, plan.band, plan.analysis_w.dtype, x.device)
            ctx = _Context(mask + (False,) * 5)
            args: tuple[Any, ...] = (projection, x.dtype, KEEP_COEFFICIENTS, None)
            SpatialConvFunction.forward(ctx, as_2d(x, spatial_dims), as_2d(w, spatial_dims), b, *args)
            gx, gw, gb = SpatialConvFunction.backward(ctx, as_2d(g, spatial_dims))[:3]
            gx = None if gx is None else gx.reshape(x.shape)
        else:
            ctx = _Context(mask + (False,) * 6)
            FFTConvFunction.forward(ctx, x, w, b, plan, spatial_dims, x.dtype, KEEP_SPECTRUM, False, None)
            gx, gw, gb = FFTConvFunction.backward(ctx, g, g.new_empty(0))[:3]
    # Distinct empty tensors for the gradients not asked for: a custom op's outputs may not alias.
    gx = input.new_empty(0) if gx is None or not need_x else (gx.squeeze(0) if unbatched else gx)
    gw = input.new_empty(0) if gw is None or not need_w else gw.reshape(weight.shape)
    gb = input.new_empty(0) if gb is None or not need_b else gb
    return (
        gx.to(input.dtype).contiguous(),
        gw.to(weight.dtype).contiguous(),
        gb.to(weight.dtype if bias is None else bias.dtype).contiguous(),
    )


@_conv_backward_op.register_fake
def _conv_backward_fake(
    grad: torch.Tensor,
    input: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    *args: Any,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    need_x, need_w, need_b = args[-1]

    def like(t: torch.Tensor | None, needed: bool) -> torch.Tensor:
        return input.new_empty(0) if t is None or not needed else t.new_empty(t.shape)

    return like(input, need_x), like(weight, need_w), like(bias, need_b)


def _setup_context(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
    input, weight, bias, compression, *arguments = inputs
    ctx.save_for_backward(input, weight, bias, compression)
    ctx.arguments = arguments[:-1]  # without memory_lean
    ctx.mark_non_differentiable(output[1])


def _backward(ctx: Any, grad: torch.Tensor, _: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
    input, weight, bias, compression = ctx.saved_tensors
    mask = list(ctx.needs_input_grad[:3])
    gx, gw, gb = _conv_backward_op(grad, input, weight, bias, compression, *ctx.arguments, mask)
    return (
        gx if mask[0] else None,
        gw if mask[1] else None,
        gb if mask[2] else None,
        *(None for _ in range(12)),
    )


_conv_op.register_autograd(_backward, setup_context=_setup_context)


def compiled_band_limited_conv(
    input: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    stride: Sequence[int],
    padding: Sequence[int] | str,
    dilation: Sequence[int],
    groups: int,
    padding_mode: str,
    compression: float,
    spatial_dims: int,
    memory_lean: bool = False,
    algorithm: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`~lightning_bandlimit.functional.fft_conv.band_limited_conv` as one traceable op.

    What a band-limited layer runs inside ``torch.compile`` (module docstring): same arguments
    (a layer's: tuples of ``spatial_dims`` ints, checked already), same result and gradients.
    ``memory_lean`` is not applied: the op keeps its input for backward, and warns once.

    Returns:
        The output, and the achieved compression as a 0-d float64 CPU tensor (a tensor, so
        that a compiled graph serves every compression).

    Example:
        >>> x, w = torch.randn(2, 3, 16, 16), torch.randn(4, 3, 3, 3)
        >>> out, achieved = compiled_band_limited_conv(x, w, None, (1, 1), (1, 1), (1, 1), 1, "zeros", 0.5, 2)
        >>> from lightning_bandlimit.functional import fft_conv2d
        >>> torch.allclose(out, fft_conv2d(x, w, padding=1, compression=0.5), atol=1e-5)
        True
        >>> round(achieved.item(), 2)
        0.49
    """
    grad = torch.is_grad_enabled()
    padding_str, pads = (padding, []) if isinstance(padding, str) else ("", list(padding))
    return torch.ops.lightning_bandlimit.conv(
        input,
        weight,
        bias,
        # Not torch.scalar_tensor(compression): AOTAutograd would specialise the graph on its value.
        torch.zeros((), dtype=torch.float64) + compression,
        list(stride),
        pads,
        padding_str,
        list(dilation),
        groups,
        padding_mode,
        spatial_dims,
        algorithm,
        [grad and input.requires_grad, grad and weight.requires_grad],
        conv_dtype(input),
        memory_lean and grad and (input.requires_grad or weight.requires_grad),
    )
