"""The elastic strategy's entry in a checkpoint, and the checks a resumed run must pass.

:class:`ResumeState` is what ``ElasticDDPStrategy`` saves under ``checkpoint["elastic_ddp"]``
(``"format": 2``) and reads back on a resume; :func:`check_resumable`,
:func:`check_optimizer_family` and :func:`check_same_checkpoint` reject a checkpoint this run
cannot continue, before anything is written; :class:`CheckedResume` is the strategy's side of
loading one (it says why a checkpoint does not fit where torch would fail with a bare error).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from lightning_bandlimit.strategies.elastic_resize import Rewarm
from lightning_bandlimit.strategies.scaling_rule import ScalingRule, TrainingConfig

__all__ = [
    "CHECKPOINT_KEY",
    "FORMAT",
    "CheckedResume",
    "ResumeState",
    "check_same_checkpoint",
    "check_optimizer_family",
    "check_optimizer_states",
    "check_resumable",
]

#: the checkpoint key of the strategy's state
CHECKPOINT_KEY = "elastic_ddp"
#: the layout of that state; a checkpoint with another one is refused (its fields may mean other things)
FORMAT = 2


def _config(saved: Mapping[str, Any]) -> TrainingConfig:
    betas = saved.get("betas")
    return TrainingConfig(**{**saved, "betas": None if betas is None else (float(betas[0]), float(betas[1]))})


@dataclass(frozen=True)
class ResumeState:
    """What an elastic run needs to continue at another size.

    Attributes:
        reference: the configuration the run was planned with (its first launch).
        applied: the configuration the run trained with when saved.
        world_size: the number of processes when saved.
        samples_seen: samples trained on so far.
        rule: the class name of the scaling rule when saved (for the record).
        sampler: the :class:`ElasticSampler`'s state (the data position), if any.
        guard: the :class:`StabilityGuard`'s state, if any.
        noise: AdaScale's running gradient statistics (``trace``, ``mu2``).
        rewarm: the LR ramp still under way, if any.

    Example:
        >>> config = TrainingConfig(world_size=2, per_device_batch=8)
        >>> state = ResumeState(config, config, world_size=2, samples_seen=64)
        >>> ResumeState.from_checkpoint(state.to_checkpoint(), "last.ckpt") == state
        True
    """

    reference: TrainingConfig
    applied: TrainingConfig
    world_size: int
    samples_seen: int = 0
    rule: str | None = None
    sampler: dict[str, Any] | None = None
    guard: dict[str, Any] | None = None
    noise: dict[str, float] = field(default_factory=dict)
    rewarm: Rewarm | None = None

    def to_checkpoint(self) -> dict[str, Any]:
        """The checkpoint entry (plain Python values)."""
        return {
            "format": FORMAT,
            "reference": asdict(self.reference),
            "applied": asdict(self.applied),
            "world_size": self.world_size,
            "samples_seen": self.samples_seen,
            "rule": self.rule,
            "sampler": self.sampler,
            "guard": self.guard,
            "noise": dict(self.noise),
            "rewarm": None
            if self.rewarm is None
            else [self.rewarm.start, self.rewarm.length, self.rewarm.initial],
        }

    @classmethod
    def from_checkpoint(cls, saved: Mapping[str, Any], path: str) -> ResumeState:
        """Read a checkpoint entry written by :meth:`to_checkpoint`.

        Args:
            saved: the entry.
            path: the checkpoint's path, for messages.

        Raises:
            ValueError: if the entry has another format than :data:`FORMAT`.
        """
        found = saved.get("format")
        if found != FORMAT:
            raise ValueError(
                f"ElasticDDPStrategy: the checkpoint {path} holds elastic state of format {found!r}; this "
                f"version reads format {FORMAT} only, so it cannot resume it (nothing was written)"
            )
        rewarm = saved.get("rewarm")
        return cls(
            reference=_config(saved["reference"]),
            applied=_config(saved.get("applied") or saved["reference"]),
            world_size=int(saved["world_size"]),
            samples_seen=int(saved.get("samples_seen", 0)),
            rule=saved.get("rule"),
            sampler=saved.get("sampler"),
            guard=saved.get("guard"),
            noise={k: float(v) for k, v in (saved.get("noise") or {}).items()},
            rewarm=Rewarm(int(rewarm[0]), int(rewarm[1]), float(rewarm[2])) if rewarm else None,
        )


def check_optimizer_family(saved_has_betas: bool, has_betas: bool, path: str | None) -> None:
    """Refuse to resume an optimizer state of another family (Adam-like or not).

    Raises:
        ValueError: if one has betas and the other not.
    """
    if saved_has_betas != has_betas:
        kinds = {True: "an Adam-family optimizer", False: "an optimizer without betas"}
        raise ValueError(
            f"ElasticDDPStrategy: the checkpoint {path} was written with {kinds[saved_has_betas]}, "
            f"this run uses {kinds[has_betas]}; it cannot resume it (nothing was written)"
        )


def check_optimizer_states(
    optimizers: Sequence[torch.optim.Optimizer], saved: Sequence[Mapping[str, Any]], path: str | None
) -> None:
    """:func:`check_optimizer_family` for each optimizer and its saved state (torch itself fails
    with a bare ``KeyError`` when the family changed).

    Raises:
        ValueError: if an optimizer's family differs from its saved state's.
    """
    for optimizer, state in zip(optimizers, saved):
        saved_groups = state.get("param_groups", [])
        if saved_groups:
            check_optimizer_family(
                any("betas" in g for g in saved_groups),
                any("betas" in g for g in optimizer.param_groups),
                path,
            )


def check_resumable(
    reference: TrainingConfig, launched: TrainingConfig, rule: ScalingRule, world_size: int, path: str | None
) -> None:
    """Refuse a checkpoint planned with ``reference`` that this launch cannot continue.

    Args:
        reference: the checkpoint's reference configuration.
        launched: this launch's configuration, as read from its optimizer.
        rule: the scaling rule of this launch.
        world_size: this launch's number of processes.
        path: the checkpoint's path, for messages.

    Raises:
        ValueError: for another per-device batch (unless the rule chooses it, as
            :class:`ExactGlobalBatch` does), another optimizer family, or a rule that does not apply.
    """
    where = f"the checkpoint {path}"
    if launched.per_device_batch != reference.per_device_batch and not rule.chooses_micro_batch:
        raise ValueError(
            f"ElasticDDPStrategy: {where} was planned with a per-device batch of "
            f"{reference.per_device_batch}, this run has {launched.per_device_batch}; the rules rescale for "
            "a change in the number of processes, so keep the per-device batch (nothing was written)"
        )
    check_optimizer_family(reference.betas is not None, launched.betas is not None, path)
    try:
        rule.adjust(reference, world_size, accumulation=launched.accumulation)
    except ValueError as error:
        raise ValueError(
            f"ElasticDDPStrategy: the rule {rule!r} cannot apply to {where}: {error} (nothing was written)"
        ) from None


def check_same_checkpoint(rows: Sequence[Sequence[int]], path: str | None) -> None:
    """Every rank must have resumed the same checkpoint (each resolves ``last`` on its own).

    Args:
        rows: per rank, the global step and the samples seen it resumed.
        path: the checkpoint this rank read, for the message.

    Raises:
        RuntimeError: if two ranks differ (torchrun then restarts the group).

    Example:
        >>> check_same_checkpoint([[4, 32], [4, 32]], "last.ckpt")
    """
    rows = [list(row) for row in rows]
    if any(row != rows[0] for row in rows):
        raise RuntimeError(
            "ElasticDDPStrategy: the ranks resumed different checkpoints (global step, samples seen "
            f"per rank: {rows}; this rank read {path}); stopping before any step so "
            "that torchrun restarts the group (nothing was written)"
        )


class CheckedResume:
    """Mixin for a Lightning strategy (before it in the bases): reads :class:`ResumeState` from the
    checkpoint loaded, and refuses a model or optimizer state that does not fit this run, saying so
    and that nothing was written.

    Attributes:
        _restored: the checkpoint's elastic state (``None``: none, or not resumed).
        _restored_path: the checkpoint's path.
    """

    _restored: ResumeState | None = None
    _restored_path: str | None = None

    def load_checkpoint(
        self, checkpoint_path: str | Path, weights_only: bool | None = None
    ) -> dict[str, Any]:
        checkpoint = super().load_checkpoint(checkpoint_path, weights_only=weights_only)  # type: ignore[misc]
        self._restored_path = str(checkpoint_path)
        saved = checkpoint.get(CHECKPOINT_KEY)
        self._restored = None if saved is None else ResumeState.from_checkpoint(saved, self._restored_path)
        return checkpoint

    def load_model_state_dict(self, checkpoint: Any, strict: bool = True) -> None:
        try:
            super().load_model_state_dict(checkpoint, strict=strict)  # type: ignore[misc]
        except RuntimeError as error:
            raise RuntimeError(
                f"ElasticDDPStrategy: the checkpoint {self._restored_path} holds a different model than this "
                f"run's, so it cannot resume it (nothing was written). {error}"
            ) from None

    def load_optimizer_state_dict(self, checkpoint: Any) -> None:
        # torch fails with a bare KeyError when the optimizer family changed: say so first
        saved = checkpoint.get("optimizer_states", [])
        check_optimizer_states(self.optimizers, saved, self._restored_path)  # type: ignore[attr-defined]
        try:
            super().load_optimizer_state_dict(checkpoint)  # type: ignore[misc]
        except (KeyError, ValueError) as error:
            raise ValueError(
                f"ElasticDDPStrategy: the optimizer state in {self._restored_path} does not fit this run's "
                f"optimizer ({type(error).__name__}: {error}); it cannot resume it (nothing was written)"
            ) from None
