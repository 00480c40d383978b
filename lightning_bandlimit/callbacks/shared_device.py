"""``SharedDevice``: memory-aware training jobs on one device share one ladder."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from typing_extensions import override

from lightning_bandlimit.callbacks.adaptive_band_limit import AdaptiveBandLimit
from lightning_bandlimit.callbacks.ladder_decisions import held_bytes
from lightning_bandlimit.ladder.reasons import HOLD, LOWER, RAISE
from lightning_bandlimit.ladder.setting import Decision, Setting
from lightning_bandlimit.memory.protocol import ProbeUnavailable
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

    A job arriving beside coordinating peers announces itself before its first step (which measures
    it), waits up to ``arrival_timeout`` seconds for each peer's check to make room for it
    (exact rungs only, as much as the largest memory a job there measured on its top rung, else
    the largest of each job's least peak on an exact rung, less what the newcomer holds already;
    one job at a time, the cheapest first; a rung a check, each measured, when none is known to
    make the room), and runs that step on its top rung (what each stage frees is then measured
    on samples of the units' inputs, so the job gives its rungs back in one change when there is
    room); while it arrives, no peer gives anything back. Its top rung was taken before it was
    measured: at its first check in the hold band it goes down to the fastest exact rung that a
    run of its model on the device measured to keep ``min_free`` free
    (:meth:`~lightning_bandlimit.tenants.Coordination.refit`; once, and only the newcomer, which
    has the most work left: a job that made room keeps it). Under DDP (one entry per rank) a job
    does not announce its arrival, nor make room for one (its ranks move together, on a raise or
    a release): it confirms an arrival at once, as a job with no exact rung left does, so nobody
    waits for it.

    What the peers hold is not others' growth to a job's ladder: on a GPU each peer counts at
    NVML's per-process memory (:meth:`~lightning_bandlimit.memory.MemoryProbe.process_memory`: its
    CUDA context and allocator cache too, which its own peak leaves out), else at the peak it
    published; the ledger carries intent. Where NVML's process ids are not the jobs' own (a
    container), the published peaks are used, said once.

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
        arrival_timeout: the most seconds an arriving job waits for its peers to make room.

    Raises:
        ValueError: for a negative ``dwell`` or ``arrival_timeout``, a ``patience`` below 1 or a
            non-positive ``timeout``;
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
        arrival_timeout: float = 30.0,
    ) -> None:
        super().__init__()
        self.folder, self.job = Path(folder), job
        self.coordinate = check_bool("coordinate", coordinate)
        self.timeout = check_real("timeout", timeout, minimum=0, min_open=True)
        self.arrival_timeout = check_real("arrival_timeout", arrival_timeout, minimum=0)
        self.rule = Coordination(dwell=dwell, patience=patience)
        self.ledger: Ledger | None = None
        self.holds: list[dict[str, Any]] = []
        self._adaptive: AdaptiveBandLimit | None = None
        self._changed_at = 0.0
        self._said: str | None = None
        self._peers: list[Tenant] | None = None  # read for this check's decision
        self._held: int | None = None  # bytes held while arriving (None: not arriving)
        self._room_for: tuple[str, ...] = ()  # arrivals the last check made or found room for
        self._making_room = False  # the last check moved to make room for an arrival
        self._on_top = False  # the first step runs on the top rung (arrived beside peers)
        self._refit = False  # arrived on its top rung: give back what is not needed, once
        self._by_process: bool | None = None  # peers measured per process (None: not known yet)

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
        arriving = {
            "arriving": self._held is not None,
            "held": self._held,
            "room_for": self._room_for,
            "making_room": self._making_room,
        }
        return self.ledger.publish(  # type: ignore[arg-type]
            **entry, **arriving, coordinates=self.coordinate, changed_at=self._changed_at
        )

    @override
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._adaptive is not None and self.ledger is not None:
            held = held_bytes(self._adaptive.probe, trainer.strategy.root_device)
            self._on_top = self._refit = self.arrive(trainer, held)

    def first_step_on_top(self) -> bool:
        """Whether the job's first step runs on its top rung: it arrived beside coordinating peers."""
        return self._on_top

    def arrive(self, trainer: pl.Trainer, held: int) -> bool:
        """Announce the job (holding ``held`` bytes) to its coordinating peers before its first
        step, and wait up to ``arrival_timeout`` seconds for each measured peer to confirm room;
        ``True`` (run that step on the top rung) when there are such peers."""
        assert self.ledger is not None
        if not self.coordinate or trainer.world_size > 1:
            return False
        if not any(p.coordinates for p in self.ledger.peers()):
            return False
        self._held = held
        self._publish()
        deadline = time.monotonic() + self.arrival_timeout
        while True:
            waiting = [
                p.job
                for p in self.ledger.peers()
                if p.coordinates
                and not p.arriving
                and p.memory is not None
                and self.ledger.job not in p.room_for
            ]
            if not waiting:
                return True
            if time.monotonic() >= deadline:
                rank_zero_warn(
                    f"SharedDevice: {', '.join(waiting)} made no room within {self.arrival_timeout:g} s "
                    "of the job's arrival; it starts anyway, on its top rung"
                )
                return True
            if time.time() - self.ledger.last.heartbeat > self.timeout / 4:  # type: ignore[union-attr]
                self.ledger.beat()  # still here, still arriving
            time.sleep(0.05)

    def peer_memory(self) -> float | None:
        """The live peers' memory (bytes), read at a check before the ladder decides: a peer's
        own change is not others' growth to the ladder. Each peer counts at what the device
        measures for its process where the probe can tell (NVML's per-process memory: its
        context, cache and tensors, from before its first step), else at the peak it published.
        ``None`` when a peer's is unknown; ``0`` with no peers."""
        assert self.ledger is not None
        self._peers = self.ledger.peers()
        measured = self._process_memory() if self._peers else {}
        memory = [measured.get(p.pid, p.memory) for p in self._peers]
        if any(m is None for m in memory):
            return None
        return float(sum(memory))  # type: ignore[arg-type]

    def _process_memory(self) -> dict[int, int]:
        """The device's per-process memory, when the probe measures it and its process ids are
        this job's (NVML gives the host's, which a container renumbers: then none is taken)."""
        probe = self._adaptive.probe if self._adaptive is not None else None
        if probe is None or self._by_process is False:
            return {}
        try:
            found = probe.process_memory()
        except ProbeUnavailable as error:
            rank_zero_warn(f"SharedDevice: {error}; peers count at the memory they published")
            self._by_process = False
            return {}
        if found is None:
            self._by_process = False
            return {}
        if os.getpid() not in found:  # this job holds memory on the device, so it would be listed
            if self._by_process is None:
                rank_zero_info(
                    "SharedDevice: the device lists no process with this job's id (another process "
                    "namespace, as in a container): peers count at the memory they published"
                )
                self._by_process = False
            return {}
        self._by_process = True
        return found

    def __call__(self, adaptive: AdaptiveBandLimit, trainer: pl.Trainer, decision: Decision) -> Decision:
        """The check's decision after the shared rule (what ``AdaptiveBandLimit`` applies)."""
        assert self.ledger is not None
        peers, self._peers = self._peers if self._peers is not None else self.ledger.peers(), None
        self._held = None  # measured now: arrived
        me, now = self._publish(), time.time()
        why = None
        if self.coordinate:
            arrivals = trainer.world_size == 1 and any(p.arriving for p in peers) and decision.reason != RAISE
            if arrivals:
                coordinated, self._room_for, why = self.rule.arrivals(
                    decision, adaptive.setting, me, peers, now, adaptive.controller
                )
                self._making_room = coordinated.reason == RAISE and coordinated.setting != adaptive.setting
                if coordinated.setting != adaptive.setting:
                    adaptive.controller.notify_change()  # a change the ladder did not decide
            else:
                # under DDP a job makes no room for arrivals (its ranks move together, on a raise
                # or a release): nothing of it to wait for, so it confirms at once, as a job with no
                # exact rung left does (else an arrival would wait its timeout for it, and a peer
                # leaving it the room would make none)
                ddp = trainer.world_size > 1
                self._room_for = tuple(p.job for p in peers if p.arriving) if ddp else ()
                self._making_room = False
                coordinated, why = self.rule.decide(decision, adaptive.setting, me, peers, now)
                if self._refit and trainer.world_size == 1:
                    coordinated, why = self._give_back(adaptive, coordinated, why, peers, now)
            if trainer.world_size > 1 and decision.reason in (RAISE, LOWER):
                # every rank applies the same: a raise if any rank raises, a release if all do
                held = trainer.strategy.reduce_boolean_decision(why is not None, all=decision.reason == RAISE)
                coordinated = coordinated if held else decision
                why = why if held else None
            if why is not None:
                said = why
                if coordinated.setting == adaptive.setting and decision.reason != HOLD:
                    self.holds.append({"step": trainer.global_step, "held": decision.reason, "why": why})
                    said = f"{decision.reason} held: {why}"
                if why != self._said:
                    rank_zero_info(f"SharedDevice: step {trainer.global_step}: {said}")
                self._said = why
            decision = coordinated
        if decision.setting != adaptive.setting:  # peers see the change (and dwell) at once
            self._changed_at = now
        if decision.setting != adaptive.setting or (self._room_for, self._making_room) != (
            me.room_for,
            me.making_room,
        ):
            self._publish(decision.setting)
        return decision

    def _give_back(
        self, adaptive: AdaptiveBandLimit, decision: Decision, why: str | None, peers: list[Tenant], at: float
    ) -> tuple[Decision, str | None]:
        """The top rung an arrival started on, refitted by a twin's measure (once; a change the
        ladder decides itself ends the need)."""
        if decision.reason != HOLD:
            self._refit = decision.setting == adaptive.setting
            return decision, why
        refitted, because = self.rule.refit(decision, adaptive.setting, peers, at, adaptive.controller)
        if because is None:
            return decision, why
        self._refit = False
        adaptive.controller.notify_change()  # a change the ladder did not decide
        return refitted, because

    @override
    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        last = self.ledger.last if self.ledger is not None else None
        if last is None or self._adaptive is None:
            return
        if self._held is not None:  # the first step ran (and no check read it): arrived
            self._held = None
            self._publish()
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
        return {"rule": self.rule.state_dict(), "refit": self._refit}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.rule.load_state_dict(state_dict.get("rule", {}))
        self._refit = bool(state_dict.get("refit", False))
