"""``SharedDevice``: memory-aware training jobs on one device share one ladder."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_info
from typing_extensions import override

from lightning_bandlimit.callbacks.adaptive_band_limit import AdaptiveBandLimit
from lightning_bandlimit.ladder.reasons import LOWER, RAISE
from lightning_bandlimit.ladder.setting import Decision, Setting
from lightning_bandlimit.tenants.coordination import Coordination, offer
from lightning_bandlimit.tenants.ledger import Ledger, Tenant, host_device
from lightning_bandlimit.utils.validation import check_bool, check_real

__all__ = ["SharedDevice"]


class SharedDevice(Callback):
    """Share one device with other memory-aware jobs: the cheapest lever across all jobs first.

    Each job on the device runs its own :class:`AdaptiveBandLimit`; with this callback beside it,
    the jobs find each other through a ledger in ``folder`` (one small file per job, written
    atomically, with a heartbeat: :mod:`lightning_bandlimit.tenants.ledger`) and every check's
    decision goes through one rule that all jobs apply alike to the same entries
    (:mod:`lightning_bandlimit.tenants.coordination`): under a shortfall every exact rung of
    every job before any job compresses, the cheapest move first, and a job holds when a
    cheaper move of another covers the shortfall or when another changed within ``dwell``
    seconds (its effect is not in the readings yet); on release the lossy part first, across
    jobs, one job at a time. A job with no peers behaves exactly as without this callback; a
    tenant without it is a co-tenant as before. The entries are grouped by device: a GPU's UUID
    (``torch.cuda.get_device_properties``), or the host on CPU.

    Each hold is kept in :attr:`holds` (step, the decision held, why) and said once per reason.
    With ``coordinate=False`` the job only publishes its entry (its process id lets CPU jobs
    measure each other's memory) and decides alone, as today.

    Args:
        folder: a folder every job of the device can write.
        job: this job's name on the device (default: a unique one; under DDP the rank is added).
        coordinate: apply the shared rule (``False``: publish only).
        dwell: seconds after a peer's change during which a job holds.
        patience: checks a job holds in a row under pressure before it moves anyway.
        timeout: seconds after which a silent peer is taken for dead.

    Raises:
        ValueError: for a negative ``dwell``, a ``patience`` below 1 or a non-positive ``timeout``;
            in ``setup``, if the trainer has no :class:`AdaptiveBandLimit`.

    Example:
        >>> import tempfile
        >>> shared = SharedDevice(tempfile.mkdtemp(), job="a", dwell=5.0)
        >>> shared.rule.dwell, shared.coordinate
        (5.0, True)
    """

    def __init__(
        self,
        folder: str | Path,
        job: str | None = None,
        coordinate: bool = True,
        dwell: float = 0.0,
        patience: int = 3,
        timeout: float = 120.0,
    ) -> None:
        super().__init__()
        self.folder, self.job = Path(folder), job
        self.coordinate = check_bool("coordinate", coordinate)
        self.timeout = check_real("timeout", timeout, minimum=0, min_open=True)
        self.rule = Coordination(dwell=dwell, patience=patience)
        self.ledger: Ledger | None = None
        self.holds: list[dict[str, Any]] = []
        self._adaptive: AdaptiveBandLimit | None = None
        self._changed_at = 0.0
        self._said: str | None = None
        self._peers: list[Tenant] | None = None  # read for this check's decision

    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        adaptive = [cb for cb in trainer.callbacks if isinstance(cb, AdaptiveBandLimit)]
        if not adaptive:
            raise ValueError(
                "SharedDevice coordinates an AdaptiveBandLimit: add one to the trainer's callbacks"
            )
        self._adaptive = adaptive[0]
        self._adaptive.coordinator = self
        device = trainer.strategy.root_device
        key = host_device() if device.type != "cuda" else str(torch.cuda.get_device_properties(device).uuid)
        job = self.job
        if trainer.world_size > 1:
            job = f"{job or 'job'}-rank{trainer.global_rank}"
        self.ledger = Ledger(self.folder, key, job=job, timeout=self.timeout)
        self._publish()

    def _publish(self, setting: Setting | None = None) -> Tenant:
        """Write this job's entry at ``setting`` (default: the one it runs at)."""
        assert self.ledger is not None and self._adaptive is not None
        cb = self._adaptive
        entry = offer(cb.controller, cb.setting if setting is None else setting)
        return self.ledger.publish(**entry, changed_at=self._changed_at)  # type: ignore[arg-type]

    def peer_memory(self) -> float | None:
        """The memory the live peers published (their measured peaks, bytes), read at a check
        before the ladder decides: a peer's own change is not others' growth to the ladder.
        ``None`` when a peer's is unknown; ``0`` with no peers."""
        assert self.ledger is not None
        self._peers = self.ledger.peers()
        if any(p.memory is None for p in self._peers):
            return None
        return float(sum(p.memory for p in self._peers))  # type: ignore[misc]

    def __call__(self, adaptive: AdaptiveBandLimit, trainer: pl.Trainer, decision: Decision) -> Decision:
        """The check's decision after the shared rule (what ``AdaptiveBandLimit`` applies)."""
        assert self.ledger is not None
        peers, self._peers = self._peers if self._peers is not None else self.ledger.peers(), None
        me, now = self._publish(), time.time()
        why = None
        if self.coordinate:
            coordinated, why = self.rule.decide(decision, adaptive.setting, me, peers, now)
            if trainer.world_size > 1 and decision.reason in (RAISE, LOWER):
                # every rank applies the same: a raise if any rank raises, a release if all do
                held = trainer.strategy.reduce_boolean_decision(why is not None, all=decision.reason == RAISE)
                coordinated = coordinated if held else decision
                why = why if held else None
            if why is not None:
                self.holds.append({"step": trainer.global_step, "held": decision.reason, "why": why})
                if why != self._said:
                    rank_zero_info(f"SharedDevice: step {trainer.global_step}: {decision.reason} held: {why}")
                self._said = why
            decision = coordinated
        if decision.setting != adaptive.setting:  # peers see the change (and dwell) at once
            self._changed_at = now
            self._publish(decision.setting)
        return decision

    @override
    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        last = self.ledger.last if self.ledger is not None else None
        if last is None or self._adaptive is None:
            return
        if last.setting_differs(self._adaptive.setting) or time.time() - last.heartbeat > self.timeout / 4:
            self._publish()  # a change no check decided (an out-of-memory retry), or the heartbeat

    @override
    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if self.ledger is not None:
            self.ledger.leave()
            self.ledger = None
        if self._adaptive is not None and self._adaptive.coordinator is self:
            self._adaptive.coordinator = None

    @override
    def state_dict(self) -> dict[str, Any]:
        return {"rule": self.rule.state_dict()}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.rule.load_state_dict(state_dict.get("rule", {}))
