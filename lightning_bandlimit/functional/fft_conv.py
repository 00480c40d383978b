"""Band-limited convolution computed in the frequency domain: the public API and its dispatch.

:func:`fft_conv2d` and :func:`fft_conv1d` check their arguments once and choose how to compute
the convolution (:mod:`.algorithm`): the native one at a full band, the frequency-domain kernel
(:mod:`.spectral_kernel`) or the spatial one (:mod:`.spatial_conv`). The band is resolved once
per call, from the plan, and used by whichever algorithm runs.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from lightning_bandlimit.functional.algorithm import check_algorithm, choose_algorithm
from lightning_bandlimit.functional.band import SpectralBand
from lightning_bandlimit.functional.band_projection import projection_plan_for
from lightning_bandlimit.functional.dft_plan import DFTPlan
from lightning_bandlimit.functional.geometry import ConvGeometry, IntOrTuple
from lightning_bandlimit.functional.lean.conv import lean_conv
from lightning_bandlimit.functional.lean.handoff import engage, lookup, publish
from lightning_bandlimit.functional.lean.ops import lean_wanted
from lightning_bandlimit.functional.lean.regions import hands_spectrum_on, keeps_spectra
from lightning_bandlimit.functional.lean.sources import Saved
from lightning_bandlimit.functional.spatial_conv import SpatialConvFunction, spatial_conv
from lightning_bandlimit.functional.spectral_kernel import (
    KEEP_SMALLER,
    KEEP_SPECTRUM,
    RETURN_KEPT_INPUT,
    FFTConvFunction,
    FromInput,
    Spectrum,
    as_2d,
    compute_dtypes,
    itemsize,
)
from lightning_bandlimit.functional.spectrum_split import input_plan, spectrum_bytes
from lightning_bandlimit.utils.validation import check_compression

__all__ = ["auto_algorithm", "band_limited_conv", "fft_conv1d", "fft_conv2d", "native_band"]

# A memory-lean layer whose kept input is at most this fraction of its output hands the output on
# as "recompute me from my input" (a stem): the recompute costs a narrow convolution.
_FROM_INPUT_RATIO = 4


def band_limited_conv(
    input: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    stride: IntOrTuple,
    padding: IntOrTuple | str,
    dilation: IntOrTuple,
    groups: int,
    padding_mode: str,
    compression: float,
    spatial_dims: int,
    memory_lean: bool = False,
    algorithm: str = "auto",
    grads: tuple[bool, bool] | None = None,
) -> tuple[torch.Tensor, SpectralBand]:
    """:func:`fft_conv2d` (``spatial_dims=2``) or :func:`fft_conv1d`, and the band it kept.

    The dispatch behind both, for callers that checked ``compression`` and ``algorithm``
    already (the public functions, a band-limited layer's setters): it trusts them. The band is
    resolved once, in the plan, whichever algorithm runs. ``grads``, ``(input, weight)``: whether
    their gradients will be computed, for the choice of ``algorithm="auto"`` (default: whether
    autograd records them), for callers below autograd (:mod:`.compile`).

    Raises:
        TypeError: if ``input`` or ``weight`` is not a tensor.
        ValueError: as :func:`fft_conv2d`, for the tensors and the geometry.
    """
    if not isinstance(input, torch.Tensor):
        raise TypeError(f"conv{spatial_dims}d: input must be a tensor, got {type(input).__name__}")
    unbatched = input.dim() == spatial_dims + 1
    batched = input.unsqueeze(0) if unbatched else input
    plan = input_plan(
        batched,
        weight,
        bias,
        stride,
        padding,
        dilation,
        groups,
        padding_mode,
        compression,
        spatial_dims,
        algorithm,
    )
    geometry = plan.geometry
    compute_dtype, out_dtype = compute_dtypes(batched)
    lean = memory_lean and not unbatched and lean_wanted(batched, weight, bias)
    found = lookup(batched) if lean else None
    source, tensors = found if found is not None else (None, ())
    out_numel = batched.shape[0] * weight.shape[0] * geometry.out_size[0] * geometry.out_size[1]
    spectrum_numel = 2 * plan.band.kept * batched.shape[0] * weight.shape[0]
    publish_spectrum = lean and hands_spectrum_on(
        spectrum_numel * itemsize(compute_dtype), out_numel * itemsize(out_dtype)
    )
    if algorithm == "auto":
        if grads is None:
            grad = torch.is_grad_enabled()
            grads = (grad and batched.requires_grad, grad and weight.requires_grad)
        # Only the spectral algorithm can hand its output to the next BatchNorm as a spectrum
        # smaller than the output: memory-lean training keeps it there.
        algorithm = auto_algorithm(plan, padding_mode, batched, weight, grads, spectral=publish_spectrum)
    if algorithm == "native":
        # The full band is the convolution itself: the native kernel is exact and cheapest.
        pads = tuple(p for p, _ in geometry.pads[2 - spatial_dims :])
        strides, dilations = geometry.stride[2 - spatial_dims :], geometry.dilation[2 - spatial_dims :]
        if found is not None:  # else it would keep the input, as F.conv2d does
            return lean_conv(batched, weight, bias, strides, pads, dilations, groups), plan.band
        conv = F.conv1d if spatial_dims == 1 else F.conv2d
        return conv(input, weight, bias, strides, pads, dilations, groups), plan.band
    from_input = (
        lean
        and algorithm == "spectral"
        and all(step == 1 for step in geometry.stride)
        and source is None
        and weight.requires_grad
        and _FROM_INPUT_RATIO * min(batched.nbytes, spectrum_bytes(batched, plan))
        <= min(spectrum_numel * itemsize(compute_dtype), out_numel * itemsize(out_dtype))
    )
    if from_input:
        # The output is recomputed from what the convolution keeps of its (narrow) input anyway:
        # the next BatchNorm keeps nothing new (a stem reading an RGB image). Only where the
        # spectral algorithm runs anyway, and unstrided: a strided layer's output spectrum lives
        # on its input's larger grid, and making it again costs as much as its forward did
        # (torchvision's 224 px stem: 10 % of a training step).
        publish_spectrum = False
    if algorithm == "spatial":
        projection = projection_plan_for(geometry, plan.band, compute_dtype, batched.device)
        out = spatial_conv(
            as_2d(batched, spatial_dims),
            as_2d(weight, spatial_dims),
            bias,
            projection,
            out_dtype,
            lean,
            source,
            tensors,
        )
        out = out.squeeze(-2) if spatial_dims == 1 else out
        if lean:
            publish(out, Saved(), ())  # a band-limited activation: the lean modules after it act
        return (out.squeeze(0) if unbatched else out), plan.band
    with torch.autocast(batched.device.type, enabled=False):
        out, y_spec = FFTConvFunction.apply(
            batched,
            weight,
            bias,
            plan,
            spatial_dims,
            out_dtype,
            KEEP_SMALLER if lean and not keeps_spectra() else KEEP_SPECTRUM,
            RETURN_KEPT_INPUT if from_input else publish_spectrum,
            source,
            *tensors,
        )
    if from_input:
        is_spectrum = y_spec.numel() > 0  # the kernel returns its kept spectrum, or nothing: the input
        recipe = FromInput(plan, bias is not None, spatial_dims, out_dtype, is_spectrum)
        kept = y_spec if is_spectrum else batched
        publish(out, recipe, (kept, weight) if bias is None else (kept, weight, bias))
    elif publish_spectrum:
        spectrum = Spectrum(plan, bias is not None, spatial_dims, out_dtype)
        publish(out, spectrum, (y_spec,) if bias is None else (y_spec, bias))
    elif lean:
        publish(out, Saved(), ())  # a band-limited activation: the lean modules after it act
    return (out.squeeze(0) if unbatched else out), plan.band


def _engage_if_band_limited(out: torch.Tensor) -> None:
    """A public call that ran a band-limited op under autograd makes the memory-lean modules look
    at their inputs from then on (:func:`~.lean.handoff.quiet`; a layer engages itself)."""
    node = out.grad_fn
    while node is not None and type(node).__name__.startswith("SqueezeBackward"):  # 1-d, unbatched
        node = node.next_functions[0][0]
    if node is not None and type(node) in (FFTConvFunction._backward_cls, SpatialConvFunction._backward_cls):
        engage()


def _symmetric(geometry: ConvGeometry) -> bool:
    return all(before == after for before, after in geometry.pads)


def native_band(plan: DFTPlan, padding_mode: str) -> bool:
    """Whether ``algorithm="auto"`` runs the native convolution: a full band it computes exactly."""
    return plan.band.is_full and padding_mode == "zeros" and _symmetric(plan.geometry)


def auto_algorithm(
    plan: DFTPlan,
    padding_mode: str,
    input: torch.Tensor,
    weight: torch.Tensor,
    grads: tuple[bool, bool],
    spectral: bool = False,
) -> str:
    """What ``algorithm="auto"`` runs for a batched ``input``: ``"native"`` on a full band it
    computes exactly, else ``"spectral"`` when ``spectral`` (a memory-lean layer handing its output
    on as a spectrum), else the cheaper of the two by the cost model
    (:func:`~lightning_bandlimit.functional.algorithm.choose_algorithm`; ``grads``: whether the
    input's and the weight's gradients will be computed)."""
    if native_band(plan, padding_mode):
        return "native"
    if spectral:
        return "spectral"
    return choose_algorithm(plan.geometry, plan.band, input.shape[0], input.shape[1], weight.shape[0], *grads)


def fft_conv2d(
    input: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    stride: IntOrTuple = 1,
    padding: IntOrTuple | str = 0,
    dilation: IntOrTuple = 1,
    groups: int = 1,
    *,
    padding_mode: str = "zeros",
    compression: float = 0.0,
    memory_lean: bool = False,
    algorithm: str = "auto",
) -> torch.Tensor:
    """2-D convolution (cross-correlation) computed in the frequency domain, optionally band-limited.

    Same arguments and result as ``torch.nn.functional.conv2d``, plus ``padding_mode`` as in
    ``nn.Conv2d`` and ``compression``. At ``compression=0`` the result and its gradients equal
    ``F.conv2d`` up to round-off. With ``compression=c > 0`` the spectra of the input and of the
    filter, taken on the padded-input grid, are both truncated to the low-frequency box that
    discards about a fraction ``c`` of the one-sided coefficients; the result is the exact
    (circular) cross-correlation of the band-limited input with the band-limited filter on that
    grid, cropped and strided as ``F.conv2d`` would. The achieved, quantised rate is
    ``spectral_band(padded_input_size, c).compression``.

    Half-precision inputs (and autocast regions) run the frequency-domain math in float32 and
    return the dtype ``F.conv2d`` would return.

    Args:
        input: ``(N, C_in, H, W)`` or unbatched ``(C_in, H, W)``.
        weight: ``(C_out, C_in // groups, kH, kW)``.
        bias: optional ``(C_out,)``.
        stride: int or ``(sH, sW)``.
        padding: int, ``(pH, pW)``, ``"same"`` or ``"valid"``.
        dilation: int or ``(dH, dW)``.
        groups: number of blocked connections from input to output channels.
        padding_mode: ``"zeros"``, ``"reflect"``, ``"replicate"`` or ``"circular"``.
        compression: fraction of spectral coefficients to discard, in ``[0, 1)``.
        memory_lean: while gradients are recorded, keep for backward the smallest exact form of
            the input (the recipe an earlier lean op published for it, its kept spectrum, or the
            input itself), offer the output's kept spectrum to a following lean BatchNorm
            (:mod:`~lightning_bandlimit.functional.lean.ops`), and at a full band (e.g.
            ``compression=0``) run the native convolution, which is exact. The result and the
            gradients are the same either way (to round-off).
        algorithm: ``"auto"`` (default): a full band runs the native convolution, any other
            band the cheaper of ``"spectral"`` (this module's frequency-domain algorithm) and
            ``"spatial"`` (the input projected onto the band, then the native convolution),
            chosen per layer shape by a fixed cost model
            (:mod:`~lightning_bandlimit.functional.algorithm`). On a small grid at a small
            compression, where the kept band would hold more than ``SPECTRUM_PER_SAMPLE`` (1.1)
            numbers per input sample, ``"auto"`` keeps the full band: the convolution itself
            (the achieved compression says 0). Naming an algorithm forces it, at every band.
            All three give the same result and gradients (to round-off).

    Returns:
        ``(N, C_out, H_out, W_out)`` (or unbatched), as ``F.conv2d``.

    Raises:
        TypeError: if ``compression`` is not a real number (e.g. ``"0.5"``, ``True``),
            ``input``, ``weight`` or ``bias`` is not a tensor, or ``stride``, ``padding``,
            ``dilation`` or ``groups`` is not an int (or a tuple of ints).
        ValueError: on a compression outside ``[0, 1)`` (or NaN), an unknown ``algorithm``, tensors of
            the wrong rank, a channel or group mismatch, or any argument ``F.conv2d`` would
            reject; the message names the expected and the given value.

    Example:
        >>> import torch.nn.functional as F
        >>> x = torch.randn(2, 3, 16, 16, dtype=torch.float64)
        >>> w = torch.randn(4, 3, 3, 3, dtype=torch.float64)
        >>> torch.allclose(fft_conv2d(x, w, padding=1), F.conv2d(x, w, padding=1))
        True
        >>> fft_conv2d(x, w, padding=1, compression=0.5).shape
        torch.Size([2, 4, 16, 16])
    """
    out, _ = band_limited_conv(
        input,
        weight,
        bias,
        stride,
        padding,
        dilation,
        groups,
        padding_mode,
        check_compression(compression),
        2,
        memory_lean,
        check_algorithm(algorithm),
    )
    _engage_if_band_limited(out)
    return out


def fft_conv1d(
    input: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    stride: IntOrTuple = 1,
    padding: IntOrTuple | str = 0,
    dilation: IntOrTuple = 1,
    groups: int = 1,
    *,
    padding_mode: str = "zeros",
    compression: float = 0.0,
    memory_lean: bool = False,
    algorithm: str = "auto",
) -> torch.Tensor:
    """1-D convolution (cross-correlation) computed in the frequency domain, optionally band-limited.

    The 1-D counterpart of :func:`fft_conv2d`, with the arguments of
    ``torch.nn.functional.conv1d``; the band keeps the lowest one-sided frequencies
    (achieved rate: ``spectral_band((1, padded_length), c).compression``).

    Args:
        input: ``(N, C_in, L)`` or unbatched ``(C_in, L)``.
        weight: ``(C_out, C_in // groups, k)``.
        bias: optional ``(C_out,)``.
        stride: int or ``(s,)``.
        padding: int, ``(p,)``, ``"same"`` or ``"valid"``.
        dilation: int or ``(d,)``.
        groups: number of blocked connections from input to output channels.
        padding_mode: ``"zeros"``, ``"reflect"``, ``"replicate"`` or ``"circular"``.
        compression: fraction of spectral coefficients to discard, in ``[0, 1)``.
        memory_lean: as :func:`fft_conv2d`.
        algorithm: as :func:`fft_conv2d`.

    Returns:
        ``(N, C_out, L_out)`` (or unbatched), as ``F.conv1d``.

    Raises:
        TypeError, ValueError: as :func:`fft_conv2d`.

    Example:
        >>> import torch.nn.functional as F
        >>> x = torch.randn(2, 3, 50, dtype=torch.float64)
        >>> w = torch.randn(4, 3, 5, dtype=torch.float64)
        >>> torch.allclose(fft_conv1d(x, w, padding="same"), F.conv1d(x, w, padding="same"))
        True
    """
    out, _ = band_limited_conv(
        input,
        weight,
        bias,
        stride,
        padding,
        dilation,
        groups,
        padding_mode,
        check_compression(compression),
        1,
        memory_lean,
        check_algorithm(algorithm),
    )
    _engage_if_band_limited(out)
    return out
