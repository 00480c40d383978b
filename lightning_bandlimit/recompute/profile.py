"""One training forward seen unit by unit: its stages, what checkpointing each unit frees and
costs, and the rung plan from them.

A :class:`UnitProfile` hooks the units (as
:func:`~lightning_bandlimit.recompute.unit_choice.checkpoint_units` gives them) for one forward
with gradients and records, per unit, its output shape (the stages: consecutive units of one
resolution), the bytes saved for backward while it ran
(:class:`~lightning_bandlimit.recompute.saved_tensors.SavedTensorMeter`) less its input, which a
checkpointed unit keeps (what its full mode frees), the same less its convolutions' and linear
layers' outputs and its own output (what its pointwise mode frees), its forward time and its
layers' (what recomputing costs), the autocast it ran under and, on request, samples of its
input (for :func:`~lightning_bandlimit.recompute.trial.trial` and
:mod:`~lightning_bandlimit.recompute.sampled_savings`). :meth:`UnitProfile.plan` turns those
figures into the rungs of :func:`~lightning_bandlimit.recompute.plan.plan_rungs`, cheapest bytes
first.
"""

from __future__ import annotations

import math
import time
from collections.abc import Collection, Iterable
from typing import Any

import torch
from torch import nn
from torch.utils import _pytree as pytree

from lightning_bandlimit.recompute.plan import RungPlan, UnitCost, plan_rungs
from lightning_bandlimit.recompute.pointwise import LAYER_TYPES
from lightning_bandlimit.recompute.saved_tensors import SavedTensorMeter
from lightning_bandlimit.recompute.units import Unit

__all__ = ["UnitProfile"]


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
        units: the units, as :func:`~lightning_bandlimit.recompute.unit_choice.checkpoint_units`
            returns them.
        exclude: tensors not to count (pass the model's parameters).
        record: keep detached copies of the first ``record`` samples of each unit's positional
            arguments (:attr:`inputs`, for :func:`~lightning_bandlimit.recompute.trial.trial`).

    Example:
        >>> from lightning_bandlimit.models import cifar_resnet18
        >>> from lightning_bandlimit.recompute.unit_choice import checkpoint_units
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
