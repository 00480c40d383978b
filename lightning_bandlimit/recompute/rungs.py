"""The exact rungs of checkpointing over a model's units, switched between steps.

A :class:`CheckpointRungs` holds a model's units and its rungs, each a list of moves (a unit in
its full mode, or :func:`~lightning_bandlimit.recompute.plan.pointwise_move` of it in its
pointwise mode): rung ``r`` makes the moves of the first ``r`` rungs. The rungs are set from a
:class:`~lightning_bandlimit.recompute.profile.UnitProfile` of one training forward
(:meth:`CheckpointRungs.profile`): ordered by cost (:meth:`UnitProfile.plan`, the cheapest bytes
first, as the ladder takes them by default) or by stage (:meth:`UnitProfile.stages`, highest
resolution first). :meth:`CheckpointRungs.apply` switches every unit to what a rung asks
(:func:`~lightning_bandlimit.recompute.switch.checkpoint` /
:func:`~lightning_bandlimit.recompute.switch.uncheckpoint`, in place), :attr:`CheckpointRungs.rung`
reads the rung back off the units, units that fail their trial leave the rungs
(:meth:`CheckpointRungs.remove`), and :meth:`CheckpointRungs.fallbacks` says which checkpointed
units kept their full input rather than their kept spectrum, and why.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable

import torch
from torch import nn

from lightning_bandlimit.recompute.plan import parse_move
from lightning_bandlimit.recompute.profile import UnitProfile
from lightning_bandlimit.recompute.spectral import can_keep_spectrum, spectral_fallback
from lightning_bandlimit.recompute.switch import FULL, MODES, checkpoint, checkpoint_mode, uncheckpoint
from lightning_bandlimit.recompute.units import Unit

__all__ = ["CheckpointRungs"]


class CheckpointRungs:
    """A model's units and the rungs that checkpoint them: rung ``r`` makes the moves of the first
    ``r`` rungs.

    Each rung names moves (a unit's name for its full mode,
    :func:`~lightning_bandlimit.recompute.plan.pointwise_move` of it for its pointwise one). They
    come from a :class:`~lightning_bandlimit.recompute.profile.UnitProfile` of one training forward
    (:meth:`profile`, then :meth:`set_stages`): the cost-ordered rungs of
    :meth:`~lightning_bandlimit.recompute.profile.UnitProfile.plan` or the stages of
    :meth:`~lightning_bandlimit.recompute.profile.UnitProfile.stages`. :meth:`apply` switches the
    units to a rung between steps.

    Args:
        units: the units, as :func:`~lightning_bandlimit.recompute.unit_choice.checkpoint_units`
            returns them.

    Example:
        >>> from lightning_bandlimit.models import cifar_resnet18
        >>> from lightning_bandlimit.recompute.unit_choice import checkpoint_units
        >>> model = cifar_resnet18(width=4)
        >>> rungs = CheckpointRungs(checkpoint_units(model))
        >>> with rungs.profile(exclude=model.parameters()) as profile:
        ...     _ = model(torch.rand(2, 3, 32, 32))
        >>> rungs.set_stages(profile.stages())
        >>> rungs.apply(2)
        >>> rungs.checkpointed()
        ['3', '4', '5', '6']
        >>> rungs.apply(0); rungs.checkpointed()
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
        ``record`` as :class:`~lightning_bandlimit.recompute.profile.UnitProfile`'s."""
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
            raise RuntimeError("CheckpointRungs.apply before set_stages")
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
