"""Argument checking and shape arithmetic shared by ``fft_conv1d`` and ``fft_conv2d``.

Everything here mirrors ``torch.nn.functional.conv2d`` / ``nn.Conv2d``: the same argument forms,
the same output size, and the same error messages where torch has one (raised as ``ValueError``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

__all__ = ["PADDING_MODES", "ConvGeometry", "fft_grid", "resolve_geometry"]

PADDING_MODES = ("zeros", "reflect", "replicate", "circular")

IntOrTuple = int | Sequence[int]


def _as_tuple(name: str, value: IntOrTuple, spatial_dims: int, minimum: int) -> tuple[int, ...]:
    if isinstance(value, bool):
        raise TypeError(f"{name} must be an int or a tuple of {spatial_dims} ints, got {value!r}")
    if isinstance(value, int):
        values: tuple[int, ...] = (value,) * spatial_dims
    elif isinstance(value, Sequence) and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        values = tuple(value)
        if len(values) == 1:
            values = values * spatial_dims
    else:
        raise TypeError(f"{name} must be an int or a tuple of {spatial_dims} ints, got {value!r}")
    if len(values) != spatial_dims:
        raise ValueError(
            f"expected {name} to be a single integer value or a list of {spatial_dims} values "
            f"to match the convolution dimensions, but got {name}={list(values)}"
        )
    if any(v < minimum for v in values):
        qualifier = "positive" if minimum == 1 else "non-negative"
        raise ValueError(f"{name} must be {qualifier}, got {name}={list(values)}")
    return values


@dataclass(frozen=True)
class ConvGeometry:
    """Resolved shapes of one convolution call, in two spatial dims (1-D uses height 1).

    Attributes:
        in_size: spatial size of the unpadded input ``(H, W)``.
        pads: ``((top, bottom), (left, right))`` padding.
        kernel: kernel size ``(kh, kw)``.
        stride, dilation: as in ``F.conv2d``.
        groups: number of groups.
        padding_mode: one of :data:`PADDING_MODES`.
    """

    in_size: tuple[int, int]
    pads: tuple[tuple[int, int], tuple[int, int]]
    kernel: tuple[int, int]
    stride: tuple[int, int]
    dilation: tuple[int, int]
    groups: int
    padding_mode: str

    @property
    def grid(self) -> tuple[int, int]:
        """The FFT grid: the padded input's spatial size."""
        return (
            self.in_size[0] + sum(self.pads[0]),
            self.in_size[1] + sum(self.pads[1]),
        )

    @property
    def dilated_kernel(self) -> tuple[int, int]:
        """Extent of the dilated kernel ``d * (k - 1) + 1`` per dim."""
        return tuple(d * (k - 1) + 1 for d, k in zip(self.dilation, self.kernel))  # type: ignore[return-value]

    @property
    def out_size(self) -> tuple[int, int]:
        """Spatial output size, as ``F.conv2d`` computes it."""
        return tuple(  # type: ignore[return-value]
            (g - k) // s + 1 for g, k, s in zip(self.grid, self.dilated_kernel, self.stride)
        )


def resolve_geometry(
    input: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    stride: IntOrTuple,
    padding: IntOrTuple | str,
    dilation: IntOrTuple,
    groups: int,
    padding_mode: str,
    spatial_dims: int,
) -> ConvGeometry:
    """Check the arguments of a convolution call and resolve its geometry.

    ``input`` must already be batched (``N, C, *spatial``).

    Args:
        input: batched input, ``(N, C, *spatial)``.
        weight: ``(out_channels, in_channels // groups, *kernel)``.
        bias: ``(out_channels,)`` or ``None``.
        stride, padding, dilation, groups: as in ``torch.nn.functional.conv2d``.
        padding_mode: one of :data:`PADDING_MODES`.
        spatial_dims: 1 or 2.

    Raises:
        TypeError: for an argument of the wrong type (a tensor, an int, a tuple of ints).
        ValueError: naming the expected and the given value for any inconsistent argument.

    Example:
        >>> x, w = torch.zeros(2, 3, 32, 32), torch.zeros(8, 3, 3, 3)
        >>> g = resolve_geometry(x, w, None, 2, 1, 1, 1, "zeros", 2)
        >>> g.grid, g.out_size
        ((34, 34), (16, 16))
    """
    name = f"conv{spatial_dims}d"
    if not isinstance(input, torch.Tensor) or not isinstance(weight, torch.Tensor):
        raise TypeError(
            f"{name}: input and weight must be tensors, got {type(input).__name__} "
            f"and {type(weight).__name__}"
        )
    if weight.dim() != spatial_dims + 2:
        raise ValueError(
            f"{name}: expected weight to be {spatial_dims + 2}-dimensional "
            f"(out_channels, in_channels/groups, kernel...), but got {weight.dim()}-dimensional "
            f"weight of size {list(weight.shape)}"
        )
    if input.dim() != spatial_dims + 2:
        raise ValueError(
            f"{name}: expected {spatial_dims + 1}D (unbatched) or {spatial_dims + 2}D (batched) "
            f"input, but got input of size: {list(input.shape)}"
        )
    if not input.is_floating_point():
        raise ValueError(f"{name}: expected a floating-point input, got dtype {input.dtype}")
    # Under autocast F.conv2d casts input, weight and bias to one dtype itself.
    autocast = torch.is_autocast_enabled(input.device.type) and input.dtype != torch.float64
    if weight.dtype != input.dtype and not autocast:
        raise ValueError(
            f"{name}: input type ({input.dtype}) and weight type ({weight.dtype}) should be the same"
        )
    if input.device != weight.device:
        raise ValueError(
            f"{name}: input ({input.device}) and weight ({weight.device}) must be on the same device"
        )
    if isinstance(groups, bool) or not isinstance(groups, int):
        raise TypeError(f"{name}: groups must be an int, got groups={groups!r}")
    if groups < 1:
        raise ValueError(f"{name}: non-positive groups is not supported, got groups={groups!r}")
    out_channels, in_per_group = weight.shape[:2]
    if out_channels % groups != 0:
        raise ValueError(
            f"{name}: given groups={groups}, expected weight to be divisible by {groups} at "
            f"dimension 0, but got weight of size {list(weight.shape)} instead"
        )
    if input.shape[1] != in_per_group * groups:
        raise ValueError(
            f"{name}: given groups={groups}, weight of size {list(weight.shape)}, expected "
            f"input{list(input.shape)} to have {in_per_group * groups} channels, but got "
            f"{input.shape[1]} channels instead"
        )
    if bias is not None:
        if not isinstance(bias, torch.Tensor):
            raise TypeError(f"{name}: bias must be a tensor or None, got {type(bias).__name__}")
        if bias.shape != (out_channels,):
            given = list(bias.shape)
            raise ValueError(
                f"{name}: given weight of size {list(weight.shape)}, expected bias to be "
                f"1-dimensional with {out_channels} elements, but got bias of size {given} instead"
            )
        if bias.dtype != input.dtype and not autocast:
            raise ValueError(
                f"{name}: input type ({input.dtype}) and bias type ({bias.dtype}) should be the same"
            )
    if padding_mode not in PADDING_MODES:
        raise ValueError(f"{name}: padding_mode must be one of {list(PADDING_MODES)}, got {padding_mode!r}")

    strides = _as_tuple("stride", stride, spatial_dims, 1)
    dilations = _as_tuple("dilation", dilation, spatial_dims, 1)
    kernel = tuple(weight.shape[2:])
    in_size = tuple(input.shape[2:])
    if isinstance(padding, str):
        if padding == "valid":
            pads = tuple((0, 0) for _ in range(spatial_dims))
        elif padding == "same":
            if any(s != 1 for s in strides):
                raise ValueError(
                    f"{name}: padding='same' is not supported for strided convolutions, "
                    f"got stride={list(strides)}"
                )
            totals = [d * (k - 1) for d, k in zip(dilations, kernel)]
            pads = tuple((t // 2, t - t // 2) for t in totals)
        else:
            raise ValueError(
                f"{name}: invalid padding string {padding!r}, should be one of ['valid', 'same']"
            )
    else:
        pads = tuple((p, p) for p in _as_tuple("padding", padding, spatial_dims, 0))

    for dim, ((before, after), size) in enumerate(zip(pads, in_size)):
        if padding_mode == "reflect" and max(before, after) >= size:
            raise ValueError(
                f"{name}: padding size should be less than the corresponding input dimension for "
                f"padding_mode='reflect', but got padding ({before}, {after}) at spatial dim "
                f"{dim} of input size {size}"
            )
        if padding_mode == "circular" and max(before, after) > size:
            raise ValueError(
                f"{name}: padding value causes wrapping around more than once for "
                f"padding_mode='circular': padding ({before}, {after}) at spatial dim {dim} of "
                f"input size {size}"
            )
    padded = [size + before + after for (before, after), size in zip(pads, in_size)]
    extent = [d * (k - 1) + 1 for d, k in zip(dilations, kernel)]
    if any(e > p for e, p in zip(extent, padded)):
        raise ValueError(
            f"{name}: calculated padded input size per channel: ({' x '.join(map(str, padded))}). "
            f"Kernel size: ({' x '.join(map(str, extent))}). Kernel size can't be greater than "
            f"actual input size"
        )

    if spatial_dims == 1:
        return ConvGeometry(
            in_size=(1, in_size[0]),
            pads=((0, 0), pads[0]),
            kernel=(1, kernel[0]),
            stride=(1, strides[0]),
            dilation=(1, dilations[0]),
            groups=groups,
            padding_mode=padding_mode,
        )
    return ConvGeometry(
        in_size=(in_size[0], in_size[1]),
        pads=(pads[0], pads[1]),
        kernel=(kernel[0], kernel[1]),
        stride=(strides[0], strides[1]),
        dilation=(dilations[0], dilations[1]),
        groups=groups,
        padding_mode=padding_mode,
    )


def fft_grid(
    input_size: Sequence[int],
    kernel_size: Sequence[int],
    padding: IntOrTuple | str,
    dilation: IntOrTuple = 1,
) -> tuple[int, int]:
    """The FFT grid (padded input size) of a convolution, as ``(H, W)`` (``(1, L)`` in 1-D).

    This is the grid on which :func:`~lightning_bandlimit.functional.spectral_band` defines the
    kept band, so ``spectral_band(fft_grid(...), c).compression`` is the achieved rate.

    Args:
        input_size: spatial size of the input, ``(H, W)`` or ``(L,)``.
        kernel_size: ``(kH, kW)`` or ``(k,)``.
        padding: as in ``F.conv2d``: int, tuple, ``"same"`` or ``"valid"``.
        dilation: int or tuple.

    Raises:
        ValueError: if the sizes and padding do not fit together.

    Example:
        >>> fft_grid((32, 32), (3, 3), 1)
        (34, 34)
        >>> fft_grid((50,), (4,), "same")
        (1, 53)
    """
    dims = len(input_size)
    if dims not in (1, 2) or len(kernel_size) != dims:
        raise ValueError(
            f"expected input_size and kernel_size of 1 or 2 spatial dims each, got "
            f"input_size={tuple(input_size)} and kernel_size={tuple(kernel_size)}"
        )
    dilations = _as_tuple("dilation", dilation, dims, 1)
    if isinstance(padding, str):
        if padding not in ("same", "valid"):
            raise ValueError(f"invalid padding string {padding!r}, should be one of ['valid', 'same']")
        totals = [d * (k - 1) if padding == "same" else 0 for d, k in zip(dilations, kernel_size)]
    else:
        totals = [2 * p for p in _as_tuple("padding", padding, dims, 0)]
    grid = tuple(int(s) + t for s, t in zip(input_size, totals))
    return (1, grid[0]) if dims == 1 else (grid[0], grid[1])
