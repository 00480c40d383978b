"""A unit proved exact before the ladder uses it: checkpointed, it gives the gradients it gives plain.

A unit that cannot be recomputed (it mutates what it was called with, reads state its own
forward changes, or meets an op whose recompute differs) would fail in the middle of a training
step's backward, hours into a run, or worse, train on wrong gradients. :func:`trial` runs the
unit twice on a few recorded samples of its real input, plain and checkpointed, with the same
random numbers (under the autocast it ran with in training: a ``bf16-mixed`` job's samples are
bf16), and compares outputs and gradients; the BatchNorm statistics and the unit's
checkpointing state are left as they were. A failure is returned as a reason, never raised.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils import _pytree as pytree

from lightning_bandlimit.layers.band_limited import BandLimitedConvNd
from lightning_bandlimit.recompute.running_stats import running_stats_kept
from lightning_bandlimit.recompute.switch import FULL, checkpoint, checkpoint_mode, uncheckpoint

__all__ = ["float32_eps", "replayed", "trial"]

_SEED = 20231  # any fixed seed: both runs draw the same dropout masks
_GRADIENT_FLOOR = 1e-2
_TF32_EPS = 2.0**-10  # TF32 keeps 10 bits of a float32's mantissa


def float32_eps(device: torch.device, dtype: torch.dtype) -> float:
    """The relative rounding of the float32 arithmetic a unit runs at on ``device``: on CUDA,
    cuDNN's convolutions round to TF32 unless ``torch.backends.cudnn.allow_tf32`` is off (it is
    on by default), and matmuls to TF32 (``"high"``) or bf16 (``"medium"``) below
    ``torch.get_float32_matmul_precision()``'s ``"highest"``; elsewhere, and for other dtypes, 0.

    Under TF32 a difference of one unit in the last place of a float32 input (a recomputation
    that sums in another order) can come out of the next convolution as a TF32 unit of the output.

    Example:
        >>> float32_eps(torch.device("cpu"), torch.float32)
        0.0
    """
    if device.type != "cuda" or dtype != torch.float32:
        return 0.0
    precision = torch.get_float32_matmul_precision()
    if precision == "medium":
        return torch.finfo(torch.bfloat16).eps
    return _TF32_EPS if precision == "high" or torch.backends.cudnn.allow_tf32 else 0.0


def trial(
    name: str,
    unit: Any,
    args: tuple[Any, ...],
    compression: float | None = None,
    rtol: float = 1e-4,
    autocast: tuple[str, torch.dtype] | None = None,
    mode: str = FULL,
) -> str | None:
    """Why checkpointing ``unit`` is not exact on ``args``, or ``None`` when it is.

    Args:
        name: the unit's name, for the reason.
        unit: a module or a segment (anything :func:`~lightning_bandlimit.recompute.switch.checkpoint`
            takes).
        args: its positional arguments (recorded samples; tensors that require grad get gradients).
        compression: run the unit's band-limited layers at this compression for the trial (they
            are set back afterwards); ``None``: as they are.
        rtol: the largest difference allowed, relative to the largest magnitude of each tensor
            (of a gradient: at least a hundredth of the largest gradient's); under ``autocast``
            at least four units in the last place of its dtype (a GPU's backward may sum in
            another order between the two runs, and a bf16 result rounds that to a whole unit);
            likewise for float32 samples on a GPU that computes them in TF32
            (:func:`float32_eps`: cuDNN's default).
        autocast: ``(device_type, dtype)`` of the autocast the unit ran under in training
            (:attr:`~lightning_bandlimit.recompute.profile.UnitProfile.autocast`): both runs use it,
            so a ``bf16-mixed`` job's samples are tried as they were recorded.

    Example:
        >>> from torch import nn
        >>> block = nn.Sequential(nn.Conv2d(2, 2, 3, padding=1), nn.BatchNorm2d(2), nn.ReLU())
        >>> trial("block", block, (torch.randn(4, 2, 6, 6, requires_grad=True),)) is None
        True
    """
    if autocast is not None:
        rtol = max(rtol, 4 * torch.finfo(autocast[1]).eps)
    sample = next(
        (t for t in pytree.tree_leaves(args) if isinstance(t, torch.Tensor) and t.is_floating_point()), None
    )
    if sample is not None:
        rtol = max(rtol, 4 * float32_eps(sample.device, sample.dtype))
    was = checkpoint_mode(unit)
    try:
        with _compression(unit, compression), running_stats_kept(list(unit.modules())):
            uncheckpoint(unit)
            try:
                plain = _run(unit, args, autocast)
            except Exception:  # the recorded samples do not suit the unit plainly: nothing to judge
                return None
            checkpoint(unit, name, mode)
            checkpointed = _run(unit, args, autocast)
    except Exception as error:
        return f"{name}: checkpointed, it raised {type(error).__name__}: {str(error).splitlines()[0][:200]}"
    finally:
        checkpoint(unit, mode=was) if was is not None else uncheckpoint(unit)
    for what, a, b in zip(("output", "gradient"), plain, checkpointed):
        # a gradient that is zero but for round-off (a convolution's bias before a training-mode
        # BatchNorm) is compared at a hundredth of the largest one: its round-off differs
        # whenever the checkpointed unit saves other tensors than the plain one
        floor = 0.0
        if what == "gradient":
            floor = _GRADIENT_FLOOR * max(
                (t.detach().abs().max().item() for t in a if t is not None and t.numel()), default=0.0
            )
        for i, (x, y) in enumerate(zip(a, b)):
            if x is None or y is None:
                if (x is None) != (y is None):
                    return f"{name}: {what} {i} is missing on one side when checkpointed"
                continue
            if x.shape != y.shape:
                return f"{name}: {what} {i} has shape {tuple(y.shape)} checkpointed, {tuple(x.shape)} plain"
            scale = max(x.detach().abs().max().item() if x.numel() else 0.0, floor)
            error = (x - y).abs().max().item() if x.numel() else 0.0
            if not error <= rtol * max(scale, 1e-12):
                return f"{name}: checkpointed, its {what} {i} differs by {error:.3g} (scale {scale:.3g})"
    return None


def _run(
    unit: Any, args: tuple[Any, ...], autocast: tuple[str, torch.dtype] | None = None
) -> tuple[list[Any], list[Any]]:
    params = [p for m in unit.modules() for p in m.parameters(recurse=False) if p.requires_grad]
    with replayed(args, autocast) as call:
        torch.manual_seed(_SEED)
        inputs = [t for t in pytree.tree_leaves(call) if isinstance(t, torch.Tensor) and t.requires_grad]
        out = unit(*call)
    outputs = [t for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]
    floats = [t for t in outputs if t.is_floating_point() and t.requires_grad]
    if not floats:
        return [t.detach() for t in outputs], []
    generator = torch.Generator(device="cpu").manual_seed(_SEED)
    weights = [torch.randn(t.shape, generator=generator, dtype=torch.float64).to(t.device) for t in floats]
    loss = sum((t.double() * w).sum() for t, w in zip(floats, weights))
    wanted = [*inputs, *params]
    grads = torch.autograd.grad(loss, wanted, allow_unused=True)
    return [t.detach() for t in outputs], list(grads)


@contextlib.contextmanager
def replayed(args: tuple[Any, ...], autocast: tuple[str, torch.dtype] | None) -> Iterator[tuple[Any, ...]]:
    """Recorded samples ``args`` as fresh leaves (an in-place op in the unit must not change the
    samples), to call a unit with gradients on, under the training forward's ``autocast``
    (``(device_type, dtype)``, as :attr:`~lightning_bandlimit.recompute.profile.UnitProfile.autocast`
    records it) and with the job's random streams forked (left as they were afterwards)."""
    devices = sorted({t.device.index or 0 for t in pytree.tree_leaves(args) if _on_cuda(t)})
    call = pytree.tree_map_only(
        torch.Tensor, lambda t: t.detach().clone().requires_grad_(t.requires_grad), args
    )
    cast = contextlib.nullcontext() if autocast is None else torch.autocast(autocast[0], dtype=autocast[1])
    with torch.random.fork_rng(devices=devices), torch.enable_grad(), cast:
        yield call


def _on_cuda(t: Any) -> bool:
    return isinstance(t, torch.Tensor) and t.device.type == "cuda"


@contextlib.contextmanager
def _compression(unit: Any, compression: float | None) -> Iterator[None]:
    layers = [m for m in unit.modules() if isinstance(m, BandLimitedConvNd)]
    saved = [layer.compression for layer in layers]
    try:
        if compression is not None:
            for layer in layers:
                layer.compression = compression
        yield
    finally:
        for layer, value in zip(layers, saved):
            layer.compression = value
