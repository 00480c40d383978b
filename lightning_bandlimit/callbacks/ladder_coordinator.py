"""What may decide beside a job's ladder (:class:`Coordinator`: other jobs on the device, e.g.
:class:`~lightning_bandlimit.callbacks.SharedDevice`) and what it returns (:class:`Coordinated`).
"""

from __future__ import annotations

from typing import NamedTuple, Protocol

import lightning.pytorch as pl

from lightning_bandlimit.ladder.setting import Decision

__all__ = ["Coordinated", "Coordinator"]


class Coordinated(NamedTuple):
    """A check's decision after the jobs' shared rule (what :class:`Coordinator` returns)."""

    decision: Decision
    outside: bool = False  # a change the ladder did not decide: the callback tells the controller


class Coordinator(Protocol):
    """What decides beside a job's ladder for other memory-aware jobs on its device
    (:class:`~lightning_bandlimit.callbacks.SharedDevice`)."""

    def peer_memory(self) -> float | None:
        """The memory the other jobs published, bytes (``None``: not known for all of them),
        read before the ladder decides: their own changes are not others' growth."""

    def __call__(self, adaptive: pl.Callback, trainer: pl.Trainer, decision: Decision) -> Coordinated:
        """The check's decision (of ``adaptive``, the ``AdaptiveBandLimit``) after the shared rule."""

    def first_step_on_top(self) -> bool:
        """Whether the job's first step, which measures it, runs on the top rung rather than on
        rung 0 (it arrived beside peers)."""
