"""What checkpointing each unit frees, measured on a few recorded samples of its input.

A profile taken with every unit checkpointed (a job that starts on its top rung beside peers)
sees the stages but not what each unit keeps for backward: a checkpointed unit keeps only its
input. The profile's recorded samples (:attr:`~lightning_bandlimit.recompute.profile.UnitProfile.inputs`)
are enough to measure it: each unit runs once plainly on them under a
:class:`~lightning_bandlimit.recompute.saved_tensors.SavedTensorMeter`, and the bytes it saves
other than its input (which a checkpointed unit keeps), measured on all the samples and on
half of them, are extended along that line to the batch (a convolutional unit's activations are
per sample; BatchNorm's statistics and autocast's copies of the weights are once a call). The
units run under the autocast the training forward ran with (recorded by the profile), so a
``bf16-mixed`` job is measured as it trains. That is the most checkpointing the unit can free: at
least what :meth:`UnitProfile.savings` counts in a plain forward, which also subtracts an input
that an earlier op saved (a ResNet block's input, saved by the ReLU before it), and at most that
plus the input. BatchNorm statistics, the random streams and each unit's checkpointing state are
left as they were; a unit that cannot run on its samples makes the answer unknown (``None``),
never an error.
"""

from __future__ import annotations

import math
from collections.abc import Collection
from typing import Any

import torch
from torch.utils import _pytree as pytree

from lightning_bandlimit.recompute.profile import UnitProfile
from lightning_bandlimit.recompute.rungs import CheckpointRungs
from lightning_bandlimit.recompute.running_stats import running_stats_kept
from lightning_bandlimit.recompute.saved_tensors import SavedTensorMeter
from lightning_bandlimit.recompute.switch import checkpoint, checkpoint_mode, uncheckpoint
from lightning_bandlimit.recompute.trial import replayed

__all__ = ["sampled_savings", "sampled_unit_savings"]


def sampled_savings(
    stages: CheckpointRungs, profile: UnitProfile, drop: Collection[str] = ()
) -> list[int] | None:
    """Bytes checkpointing each stage of ``profile.stages(drop)`` frees, from the recorded samples.

    Args:
        stages: the units (as :class:`CheckpointRungs` holds them).
        profile: a profile that recorded samples of each unit's input (``record > 0``); call
            before anything consumes :attr:`UnitProfile.inputs`.
        drop: units left out, as for :meth:`UnitProfile.stages`.

    Returns:
        One number per stage, or ``None`` when a unit of a stage has no samples or cannot run
        plainly on them.

    Example:
        >>> from lightning_bandlimit.models import cifar_resnet18
        >>> from lightning_bandlimit.recompute.unit_choice import checkpoint_units
        >>> model = cifar_resnet18(width=4)
        >>> stages = CheckpointRungs(checkpoint_units(model))
        >>> with stages.profile(exclude=model.parameters(), checkpointed=True, record=2) as profile:
        ...     _ = model(torch.rand(8, 3, 32, 32))
        >>> profile.savings()  # every unit ran checkpointed: nothing seen
        [0, 0, 0, 0]
        >>> [s > 0 for s in sampled_savings(stages, profile)]
        [True, True, True, True]
    """
    per_unit = sampled_unit_savings(stages, profile, drop)
    if per_unit is None:
        return None
    return [sum(per_unit[name] for name in stage) for stage in profile.stages(drop)]


def sampled_unit_savings(
    stages: CheckpointRungs, profile: UnitProfile, drop: Collection[str] = ()
) -> dict[str, int] | None:
    """Bytes checkpointing each unit of ``profile.stages(drop)`` frees, from the recorded
    samples (as :func:`sampled_savings`, unit by unit); ``None`` when one is unknown."""
    per_unit: dict[str, int] = {}
    for stage in profile.stages(drop):
        for name in stage:
            args = profile.inputs.get(name)
            unit = stages.units.get(name)
            if args is None or unit is None:
                return None
            saved = _at_batch(name, unit, args, profile.batch.get(name), profile.autocast.get(name))
            if saved is None:
                return None
            per_unit[name] = saved
    return per_unit


def _at_batch(
    name: str, unit: Any, args: tuple[Any, ...], batch: int | None, autocast: tuple[str, torch.dtype] | None
) -> int | None:
    """The unit's saved bytes at ``batch`` samples: measured on all the samples and on half of
    them, and extended along that line (what is saved once a call, BatchNorm's statistics or
    autocast's low-precision copies of the weights, does not grow with the batch)."""
    tensors = [t for t in pytree.tree_leaves(args) if isinstance(t, torch.Tensor)]
    n = tensors[0].shape[0] if tensors and tensors[0].dim() else 1
    batch = n if batch is None else batch
    full = _saved(name, unit, args, autocast)
    if full is None or n < 2 or batch == n:
        return None if full is None else math.ceil(full * batch / max(1, n))
    half = n // 2
    part = pytree.tree_map_only(torch.Tensor, lambda t: t[:half] if t.dim() and t.shape[0] == n else t, args)
    less = _saved(name, unit, part, autocast)
    if less is None:
        return None
    per_sample = max(0.0, (full - less) / (n - half))
    return math.ceil(full + per_sample * (batch - n))


def _saved(
    name: str, unit: Any, args: tuple[Any, ...], autocast: tuple[str, torch.dtype] | None
) -> int | None:
    """Bytes ``unit`` saves for backward on ``args`` (its input and parameters not counted), run
    plainly, under the autocast the training forward ran with; ``None`` if it raises."""
    was = checkpoint_mode(unit)
    params = [p for m in unit.modules() for p in m.parameters(recurse=False)]
    try:  # the job's random streams are left as they were (a unit with dropout draws from them)
        with running_stats_kept(list(unit.modules())), replayed(args, autocast) as call:
            inputs = [t for t in pytree.tree_leaves(call) if isinstance(t, torch.Tensor)]
            uncheckpoint(unit)
            with SavedTensorMeter(exclude=[*params, *inputs]) as meter:
                out = unit(*call)
            del out
    except Exception:  # the samples do not suit the unit plainly: unknown
        return None
    finally:
        checkpoint(unit, name, was) if was is not None else uncheckpoint(unit)
    return meter.bytes
