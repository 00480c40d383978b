"""Decide the compression from memory headroom: thresholds, hysteresis, cooldown, a learned model.

The controller is plain Python (no Lightning), fed one memory reading per
check and, when known, the job's own peak memory at the compression it ran with:

* **Pressure** (free below ``min_free``): raise the compression at once. With a learned
  memory-versus-compression relation it jumps to the least compression predicted to free the
  missing bytes plus the *surprise*: how far free memory fell short of what the previous
  decision predicted (a co-tenant still growing, or a model too optimistic), so a co-tenant
  that grows steadily is met one check ahead. Without a relation (or when none is predicted
  to suffice) it steps up by ``raise_step``.
* **Hold** (free between ``min_free`` and ``release_free``): no change, the hysteresis band.
* **Release** (free at or above ``release_free`` for ``release_checks`` checks in a row, and
  ``cooldown_checks`` checks after the last change): lower the compression to the least one
  the learned relation predicts to keep ``release_free`` free (at once: a model error smaller
  than ``release_free - min_free`` cannot bring the job under pressure); without a usable
  relation, by ``lower_step``. Never below a compression that once ran out of memory
  (:meth:`CompressionController.on_oom`).

All changes stay within ``[min_compression, max_compression]``. It is the compression-only
ladder: a :class:`~lightning_bandlimit.ladder.controller.LadderController` with no exact rungs,
behind the compression-valued interface of earlier releases.
"""

from __future__ import annotations

from typing import Any

from lightning_bandlimit.ladder.controller import LadderController
from lightning_bandlimit.ladder.memory_model import MemoryModel
from lightning_bandlimit.ladder.setting import Decision, FreeMemory, Setting

__all__ = ["CompressionController"]


class CompressionController:
    """Maps memory readings to compressions (see the module docstring).

    Args:
        min_free: free memory to keep: bytes (``>= 1``) or a fraction of the total (``< 1``).
        release_free: free memory above which compression is given back; bytes or fraction,
            above ``min_free``. Default: ``min_free`` doubled.
        min_compression: lower bound, in ``[0, 1)``.
        max_compression: upper bound, in ``[min_compression, 1)``.
        raise_step: compression added per check under pressure when the model cannot say more.
        lower_step: compression removed per release while the memory model cannot predict.
        release_checks: consecutive checks above ``release_free`` before a release.
        cooldown_checks: checks after any change before a release.
        margin: extra fraction of the deficit to free when jumping with the model.

    Raises:
        ValueError: for thresholds or bounds out of order, or non-positive steps and counts.

    Example:
        >>> from lightning_bandlimit.memory.probes import MemoryReading
        >>> ctl = CompressionController(min_free=0.2, release_free=0.4, max_compression=0.8)
        >>> ctl.decide(MemoryReading(total=100, free=10, source="scripted"), 0.0)
        Decision(rung=0, compression=0.2, reason='raise', free=10, threshold=20)
    """

    def __init__(
        self,
        min_free: float = 0.1,
        release_free: float | None = None,
        min_compression: float = 0.0,
        max_compression: float = 0.9,
        raise_step: float = 0.2,
        lower_step: float = 0.05,
        release_checks: int = 3,
        cooldown_checks: int = 2,
        margin: float = 0.1,
    ) -> None:
        self.ladder = LadderController(
            rungs=0,
            min_free=min_free,
            release_free=release_free,
            min_compression=min_compression,
            max_compression=max_compression,
            raise_step=raise_step,
            lower_step=lower_step,
            release_checks=release_checks,
            cooldown_checks=cooldown_checks,
            margin=margin,
        )

    @property
    def model(self) -> MemoryModel:
        """The learned memory-versus-compression relation."""
        return self.ladder.compression_memory

    @property
    def oom_floor(self) -> float:
        """Releases never go below this compression (one that ran out of memory)."""
        return self.ladder.oom_floor

    @property
    def min_compression(self) -> float:
        return self.ladder.min_compression

    @property
    def max_compression(self) -> float:
        return self.ladder.max_compression

    def clamp(self, c: float) -> float:
        """``c`` within ``[min_compression, max_compression]``."""
        return self.ladder.clamp(c)

    def decide(self, reading: FreeMemory, current: float) -> Decision:
        """The compression for the next steps, given a reading taken at ``current``."""
        return self.ladder.decide(reading, Setting(0, current))

    def notify_change(self) -> None:
        """Restart the cooldown: a change this controller did not decide was applied (e.g. one
        another rank asked for, or an out-of-memory retry), so its last prediction no longer holds."""
        self.ladder.notify_change()

    def on_oom(self, current: float) -> float:
        """The compression to retry an out-of-memory step with; releases never go below it again."""
        return self.ladder.on_oom(Setting(0, current)).compression

    def state_dict(self) -> dict[str, Any]:
        state = self.ladder.state_dict()
        return {"model": state.pop("compression_memory"), **state}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.ladder.load_state_dict(state)
