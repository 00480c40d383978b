"""Activation checkpointing as a run-time lever: switched on and off per module, between steps.

:func:`~lightning_bandlimit.recompute.switch.checkpoint` changes the class of a module object to a
checkpointed subclass of its own class (made once per class), like
:mod:`lightning_bandlimit.layers.surgery` swaps convolutions: the object, its parameters, buffers,
hooks, ``state_dict`` keys and any reference to it stay, and
:func:`~lightning_bandlimit.recompute.switch.uncheckpoint` is the exact inverse. While
checkpointed, a training forward with gradients runs through ``torch.utils.checkpoint.checkpoint``
in its non-reentrant mode (the one that is safe under DDP): only the module's inputs are kept for
backward, and its forward is run again in backward to rebuild what the gradients need. Gradients
are exactly those of the module without checkpointing (the same operations run on the same
values). In eval mode or without gradients the module runs its own class's forward.

**Band-limited blocks keep less than their input.** A checkpointed block whose input reaches
its arithmetic only through memory-lean band-limited convolutions, identity shortcuts and
strided 1x1 shortcuts (a ResNet basic block) keeps only what those read, the kept input
spectrum and the shortcut's stride-grid pixels, and recomputes the rest from them
(:mod:`lightning_bandlimit.recompute.spectral`; outputs and gradients equal to round-off);
other blocks, and these at a full band or on maps too small for the spectrum to be the smaller
form, fall back to the ordinary way (:func:`~lightning_bandlimit.recompute.spectral.spectral_fallback`
says why).

**BatchNorm running statistics are updated once per step.** Recomputing a module's forward
would update its BatchNorm layers' running statistics a second time (pytorch/pytorch#96136);
the recompute here restores them afterwards, so they equal those of the same model without
checkpointing.

Which modules: :func:`checkpoint_units` finds the block-like units of a model and the
segments of its plain chains (:mod:`lightning_bandlimit.recompute.units`: one rule, per-family
knowledge as data), or takes glob patterns over qualified names.

**Never a crash, never a wrong gradient.** Container arguments are frozen at call time
(:mod:`lightning_bandlimit.recompute.arguments`); a recompute that fails raises
:class:`~lightning_bandlimit.recompute.arguments.RecomputeMismatch` naming the unit; and
:class:`~lightning_bandlimit.callbacks.AdaptiveBandLimit` tries every unit before the ladder uses
it (:func:`~lightning_bandlimit.recompute.trial.trial`) and takes a unit that is not exact off
the ladder with one warning.
"""

from __future__ import annotations

import fnmatch
import math
import time
from collections.abc import Collection, Iterable
from typing import Any

import torch
from torch import nn
from torch.utils import _pytree as pytree

from lightning_bandlimit.layers.surgery import Patterns, normalize_patterns
from lightning_bandlimit.recompute.plan import RungPlan, UnitCost, parse_move, plan_rungs
from lightning_bandlimit.recompute.pointwise import LAYER_TYPES
from lightning_bandlimit.recompute.saved_tensors import SavedTensorMeter
from lightning_bandlimit.recompute.spectral import (
    can_keep_spectrum,
    spectral_fallback,
)
from lightning_bandlimit.recompute.switch import FULL, MODES, checkpoint, checkpoint_mode, uncheckpoint
from lightning_bandlimit.recompute.units import Unit, find_units

__all__ = ["CheckpointStages", "UnitProfile", "checkpoint_units"]


def checkpoint_units(
    model: nn.Module, include: Patterns = None, exclude: Patterns = None
) -> list[tuple[str, Unit]]:
    """The units of ``model`` worth checkpointing, as ``(qualified_name, unit)`` in module order.

    Without ``include``: the block-like units of
    :func:`~lightning_bandlimit.recompute.units.find_units`, i.e. the smallest modules (not
    ``model`` itself, nor containers such as ``nn.Sequential``) whose subtree holds at least two
    convolution or linear layers, one of them a convolution with a kernel larger than 1x1
    (ResNet's, MobileNet's, EfficientNet's, RegNet's and ConvNeXt's blocks, DenseNet's layers,
    Inception's modules), and the segments of plain chains (VGG's ``features`` split at its
    pooling layers, named ``features[0:3]``); modules that checkpoint themselves are left out,
    and so is a candidate that would be the whole network. With ``include``: every module whose
    qualified name matches one of its glob patterns (no nesting: a match inside another match is
    left out). ``exclude`` removes matches either way.

    Args:
        model: the model.
        include: glob patterns over qualified module names (``"backbone.3"``, ``"layer1.*"``).
        exclude: glob patterns of modules to leave out.

    Returns:
        The units, outermost first where patterns nest.

    Raises:
        TypeError: if a pattern argument is not a string or a sequence of strings.

    Example:
        >>> from lightning_bandlimit.models import cifar_resnet18
        >>> units = checkpoint_units(cifar_resnet18(width=4))
        >>> len(units), units[0][0]
        (8, '3')
        >>> [name for name, _ in checkpoint_units(cifar_resnet18(width=4), include="[34]")]
        ['3', '4']
    """
    include_t = normalize_patterns("include", include)
    exclude_t = normalize_patterns("exclude", exclude)

    def matches(name: str, patterns: tuple[str, ...] | None) -> bool:
        return bool(patterns) and any(fnmatch.fnmatchcase(name, p) for p in patterns)  # type: ignore[union-attr]

    named = [(n, m) for n, m in model.named_modules() if n and not matches(n, exclude_t)]
    if include_t is not None:
        chosen = [(n, m) for n, m in named if matches(n, include_t)]
        return [(n, m) for n, m in chosen if not any(n.startswith(o + ".") for o, _ in chosen)]
    # a segment is named ``chain[start:stop]``: excluding the chain excludes its segments
    return [
        (n, u)
        for n, u in find_units(model)
        if not (matches(n, exclude_t) or matches(n.split("[")[0], exclude_t))
    ]


class UnitProfile:
    """One training forward seen unit by unit: the stages, and the bytes checkpointing each frees.

    Used as a context manager around a forward pass with gradients (the units not checkpointed
    yet). It is also a :class:`~lightning_bandlimit.recompute.saved_tensors.SavedTensorMeter` of the
    whole forward (:attr:`meter`).

    * **Stages**: consecutive units (in the order they ran) with the same output shape, ordered
      by output resolution, highest first: ResNet's stages.
    * **Savings** per stage: for each unit, the bytes saved for backward while it ran less the
      bytes of its input, which a checkpointed unit keeps (at least ``0``).

    Args:
        units: the units, as :func:`checkpoint_units` returns them.
        exclude: tensors not to count (pass the model's parameters).
        record: keep detached copies of the first ``record`` samples of each unit's positional
            arguments (:attr:`inputs`, for :func:`~lightning_bandlimit.recompute.trial.trial`).

    Example:
        >>> from lightning_bandlimit.models import cifar_resnet18
        >>> model = cifar_resnet18(width=4)
        >>> with UnitProfile(checkpoint_units(model), exclude=model.parameters()) as profile:
        ...     _ = model(torch.rand(2, 3, 32, 32))
        >>> profile.stages()
        [['3', '4'], ['5', '6'], ['7', '8'], ['9', '10']]
        >>> all(saving > 0 for saving in profile.savings())
        True
    """

    def __init__(
        self, units: list[tuple[str, Unit]], exclude: Iterable[torch.Tensor] = (), record: int = 0
    ) -> None:
        self.units = list(units)
        self.record = record
        self.inputs: dict[str, tuple[Any, ...]] = {}
        self.meter = SavedTensorMeter(exclude=exclude, label=self._running)
        self.order: list[str] = []
        self.shapes: dict[str, tuple[int, ...]] = {}
        self.input_bytes: dict[str, int] = {}
        self.batch: dict[str, int] = {}  # the leading size of each unit's first tensor argument
        self.autocast: dict[str, tuple[str, torch.dtype]] = {}  # the autocast each unit ran under
        self.seconds: dict[str, float] = {}  # each unit's forward time
        self.output_bytes: dict[str, int] = {}  # the bytes of each unit's output
        self.layer_seconds: dict[str, float] = {}  # of its convolutions and linear layers
        self.layer_bytes: dict[str, int] = {}  # their outputs (what a pointwise checkpoint keeps)
        self._kept: dict[str, set[int]] = {}  # storages a pointwise checkpoint keeps anyway
        self._started: dict[Any, float] = {}
        self._cuda = False
        self._stack: list[str] = []
        self._handles: list[Any] = []

    def _sample(self, t: torch.Tensor) -> torch.Tensor:
        part = t[: self.record] if t.dim() else t
        return part.detach().clone().requires_grad_(t.requires_grad)

    def _running(self) -> str | None:
        return self._stack[-1] if self._stack else None

    def _now(self) -> float:
        if self._cuda:  # the profiled step only: kernels run asynchronously
            torch.cuda.synchronize()
        return time.perf_counter()

    def _layer_hooks(self, name: str, module: Any) -> None:
        for layer in module.modules():
            if not isinstance(layer, LAYER_TYPES):
                continue

            def pre(m: nn.Module, _: Any, name: str = name) -> None:
                if self._running() == name and name not in self.shapes:
                    self._started[m] = self._now()

            def post(m: nn.Module, __: Any, output: Any, name: str = name) -> None:
                started = self._started.pop(m, None)
                if started is None or not isinstance(output, torch.Tensor):
                    return
                self.layer_seconds[name] = self.layer_seconds.get(name, 0.0) + self._now() - started
                self.layer_bytes[name] = self.layer_bytes.get(name, 0) + output.untyped_storage().nbytes()
                self._kept.setdefault(name, set()).add(output.untyped_storage().data_ptr())

            self._handles += [layer.register_forward_pre_hook(pre), layer.register_forward_hook(post)]

    def __enter__(self) -> UnitProfile:
        for name, module in self.units:

            def pre(_: nn.Module, args: tuple[Any, ...], name: str = name) -> None:
                self._stack.append(name)
                if name not in self.input_bytes:
                    tensors = [t for t in pytree.tree_leaves(args) if isinstance(t, torch.Tensor)]
                    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}
                    self.input_bytes[name] = sum(storages.values())
                    self._kept.setdefault(name, set()).update(storages)
                    self.batch[name] = tensors[0].shape[0] if tensors and tensors[0].dim() else 1
                    kind = tensors[0].device.type if tensors else "cpu"
                    if torch.is_autocast_enabled(kind):
                        self.autocast[name] = (kind, torch.get_autocast_dtype(kind))
                    if self.record:
                        self.inputs[name] = pytree.tree_map_only(torch.Tensor, self._sample, args)
                    self._cuda = kind == "cuda"
                    self._started[name] = self._now()

            def post(_: nn.Module, __: Any, output: Any, name: str = name) -> None:
                self._stack.pop()
                if name not in self.shapes and isinstance(output, torch.Tensor):
                    started = self._started.pop(name, None)
                    if started is not None:
                        self.seconds[name] = self._now() - started
                    self.output_bytes[name] = output.untyped_storage().nbytes()
                    self._kept.setdefault(name, set()).add(output.untyped_storage().data_ptr())
                    self.order.append(name)
                    self.shapes[name] = tuple(output.shape[1:])

            self._handles += [module.register_forward_pre_hook(pre), module.register_forward_hook(post)]
            self._layer_hooks(name, module)
        self.meter.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.meter.__exit__(*exc)
        for handle in self._handles:
            handle.remove()
        self._handles = []

    def stages(self, drop: Collection[str] = ()) -> list[list[str]]:
        """Names of the units that ran, by stage, highest output resolution first; the units
        named in ``drop`` are left out (a stage left empty goes)."""
        runs: list[list[str]] = []
        for name in self.order:
            if runs and self.shapes[runs[-1][-1]] == self.shapes[name]:
                runs[-1].append(name)
            else:
                runs.append([name])
        ordered = sorted(runs, key=lambda run: -math.prod(self.shapes[run[0]][1:]))
        kept = [[name for name in run if name not in drop] for run in ordered]
        return [run for run in kept if run]

    def savings(self, drop: Collection[str] = ()) -> list[int]:
        """Bytes checkpointing each stage of :meth:`stages` frees (estimated from this forward)."""
        per_unit = self.unit_savings()
        return [sum(per_unit.get(name, 0) for name in stage) for stage in self.stages(drop)]

    def unit_savings(self) -> dict[str, int]:
        """Bytes checkpointing each unit that ran frees (estimated from this forward)."""
        inside = self.meter.bytes_by_label
        return {name: max(0, inside.get(name, 0) - self.input_bytes.get(name, 0)) for name in self.order}

    def _typical_seconds(self, name: str) -> tuple[float | None, float]:
        """The unit's forward time and its layers', as the mean over the units of its class
        and shapes (one timed forward is noisy: the first call of a kernel pays its set-up)."""
        key = self._signature(name)
        alike = [n for n in self.order if self._signature(n) == key and n in self.seconds]
        if name not in self.seconds or not alike:
            return None, 0.0
        return (
            sum(self.seconds[n] for n in alike) / len(alike),
            sum(self.layer_seconds.get(n, 0.0) for n in alike) / len(alike),
        )

    def _signature(self, name: str) -> tuple[Any, ...]:
        unit = dict(self.units).get(name)
        return (type(unit).__name__, self.shapes.get(name), self.input_bytes.get(name))

    def pointwise_savings(self) -> dict[str, int]:
        """Bytes checkpointing each unit that ran in its pointwise mode frees (estimated from this
        forward): what it saved other than its input, its convolutions' and linear layers'
        outputs and its own output (which what follows it keeps)."""
        storages = self.meter.storages_by_label()
        return {
            name: sum(
                size
                for pointer, size in storages.get(name, {}).items()
                if pointer not in self._kept.get(name, ())
            )
            for name in self.order
        }

    def plan(
        self,
        drop: Collection[str] = (),
        no_pointwise: Collection[str] = (),
        full: dict[str, int] | None = None,
        least: dict[str, int] | None = None,
        max_rungs: int = 8,
        pointwise: bool = True,
    ) -> RungPlan:
        """The exact rungs by bytes freed per second of recompute
        (:func:`~lightning_bandlimit.recompute.plan.plan_rungs`), from this forward's bytes and
        times: a unit's pointwise move frees what it saved less its input, its convolutions'
        outputs and its own output (kept by what follows it), and costs its forward less its
        convolutions'.

        Args:
            drop: units left out.
            no_pointwise: units without a pointwise move (e.g. not exact in that mode).
            full: bytes checkpointing each unit in full frees (default: :meth:`unit_savings`).
            least: the least each may free (default: ``full``).
            max_rungs: the most rungs.
            pointwise: offer each unit's pointwise move (else full moves only).
        """
        pointwise_seen = None if full is not None else self.pointwise_savings()
        full = self.unit_savings() if full is None else full
        least = full if least is None else least
        names = [name for stage in self.stages(drop) for name in stage]
        costs = {}
        for name in names:
            layers = self.layer_bytes.get(name)
            freed = None  # by the unit's pointwise move
            if pointwise and layers is not None and name not in no_pointwise:
                if pointwise_seen is not None:
                    freed = min(pointwise_seen.get(name, 0), full[name])
                else:  # measured checkpointed: the full figure less what the mode keeps anyway
                    freed = max(0, full[name] - layers - self.output_bytes.get(name, 0))
            seconds, layer_seconds = self._typical_seconds(name)
            rest = None if seconds is None else max(0.0, seconds - layer_seconds)
            costs[name] = UnitCost(full[name], least.get(name, full[name]), seconds, freed, rest)
        return plan_rungs(costs, names, max_rungs)


class CheckpointStages:
    """A model's units grouped in stages; rung ``r`` checkpoints the first ``r`` stages.

    The stages come from a :class:`UnitProfile` of one training forward (:meth:`profile`, then
    :meth:`set_stages`). :meth:`apply` switches units on and off between steps.

    Args:
        units: the units, as :func:`checkpoint_units` returns them.

    Example:
        >>> from lightning_bandlimit.models import cifar_resnet18
        >>> model = cifar_resnet18(width=4)
        >>> stages = CheckpointStages(checkpoint_units(model))
        >>> with stages.profile(exclude=model.parameters()) as profile:
        ...     _ = model(torch.rand(2, 3, 32, 32))
        >>> stages.set_stages(profile.stages())
        >>> stages.apply(2)
        >>> stages.checkpointed()
        ['3', '4', '5', '6']
        >>> stages.apply(0); stages.checkpointed()
        []
    """

    def __init__(self, units: list[tuple[str, Unit]]) -> None:
        self.units = dict(units)
        self.stages: list[list[str]] | None = None

    def profile(
        self, exclude: Iterable[torch.Tensor] = (), checkpointed: bool = False, record: int = 0
    ) -> UnitProfile:
        """A profile of the next forward: every unit runs un-checkpointed during it, or with
        ``checkpointed=True`` checkpointed (stages only: what a unit frees is then not seen; see
        :mod:`~lightning_bandlimit.recompute.sampled_savings`);
        ``record`` as :class:`UnitProfile`'s."""
        for name, module in self.units.items():
            checkpoint(module, name) if checkpointed else uncheckpoint(module)
        return UnitProfile(list(self.units.items()), exclude=exclude, record=record)

    def remove(self, names: Collection[str], pointwise_only: bool = False) -> None:
        """Take the units ``names`` off the ladder: back to their own class, out of every rung;
        with ``pointwise_only``, only their pointwise moves go (a unit not exact in that mode).

        Raises:
            ValueError: for a name that is not one of the units.
        """
        self._check_known(names)
        if not pointwise_only:
            for name in names:
                uncheckpoint(self.units.pop(name))
        if self.stages is not None:

            def gone(move: str) -> bool:
                name, mode = parse_move(move)
                return name in names and (not pointwise_only or mode != FULL)

            stages = [[m for m in stage if not gone(m)] for stage in self.stages]
            self.stages = [stage for stage in stages if stage]
            if pointwise_only:
                self.apply(min(self.rung, len(self.stages)))

    def set_stages(self, stages: list[list[str]]) -> None:
        """The rungs: the units each checkpoints, first rung first, as :meth:`UnitProfile.stages`
        gives them (stages, highest resolution first) or as :meth:`UnitProfile.plan` does (moves:
        a unit's name for its full mode,
        :func:`~lightning_bandlimit.recompute.plan.pointwise_move` of it for its pointwise one).

        Raises:
            ValueError: for a name that is not one of the units.
        """
        self._check_known([parse_move(move)[0] for stage in stages for move in stage])
        self.stages = [list(stage) for stage in stages]

    def _check_known(self, names: Iterable[str]) -> None:
        unknown = [name for name in names if name not in self.units]
        if unknown:
            raise ValueError(f"unknown units {unknown}; expected names among {sorted(self.units)}")

    def modes_at(self, rung: int) -> dict[str, str]:
        """The mode of each unit ``rung`` checkpoints (the others run plainly)."""
        modes: dict[str, str] = {}
        for stage in (self.stages or [])[:rung]:
            for move in stage:
                name, mode = parse_move(move)
                if MODES.index(mode) >= MODES.index(modes.get(name, mode)):
                    modes[name] = mode
        return modes

    def apply(self, rung: int) -> None:
        """Checkpoint what the first ``rung`` rungs name, in their modes, and no other unit.

        Raises:
            RuntimeError: before :meth:`set_stages`.
            ValueError: for a rung outside ``[0, len(stages)]``.
        """
        if self.stages is None:
            raise RuntimeError("CheckpointStages.apply before set_stages")
        if not 0 <= rung <= len(self.stages):
            raise ValueError(f"rung must be in [0, {len(self.stages)}], got {rung}")
        modes = self.modes_at(rung)
        for name, module in self.units.items():
            checkpoint(module, name, modes[name]) if name in modes else uncheckpoint(module)

    @property
    def rung(self) -> int:
        """The rung the units are switched to, read off the units: how many rungs, from the
        first, have every move made (``0`` before :meth:`set_stages`)."""
        rung = 0
        for stage in self.stages or ():
            for move in stage:
                name, mode = parse_move(move)
                now = checkpoint_mode(self.units[name])
                if now is None or MODES.index(now) < MODES.index(mode):
                    return rung
            rung += 1
        return rung

    def units_at(self, rung: int) -> int:
        """How many units rung ``rung`` checkpoints (``0`` before :meth:`set_stages`)."""
        return len(self.modes_at(rung))

    def checkpointed(self) -> list[str]:
        """Names of the units checkpointed now."""
        return [name for name, module in self.units.items() if checkpoint_mode(module) is not None]

    def keep_spectrum(self) -> bool:
        """Whether every unit, checkpointed, keeps only its kept spectrum at a band-limiting
        compression (:func:`~lightning_bandlimit.recompute.spectral.can_keep_spectrum`)."""
        return bool(self.units) and all(
            isinstance(m, nn.Module) and can_keep_spectrum(m) for m in self.units.values()
        )

    def fallbacks(self) -> dict[str, str]:
        """Checkpointed units whose last training forward kept their full input, and why."""
        reasons = {name: spectral_fallback(m) for name, m in self.units.items() if checkpoint_mode(m) == FULL}
        return {name: reason for name, reason in reasons.items() if reason is not None}

    def release(self) -> None:
        """Every unit back to its own class (the model as it was)."""
        for module in self.units.values():
            uncheckpoint(module)
