"""``SharedDevice``: memory-aware training jobs on one device share one ladder: the callback
finds its peers through a ledger, announces its arrival and waits for room, and puts every check's
decision through the rule all jobs share; what the peers hold is read by
:mod:`~lightning_bandlimit.callbacks.shared_peers`."""

from __future__ import annotations

import atexit
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from typing_extensions import override

from lightning_bandlimit.callbacks.adaptive_band_limit import AdaptiveBandLimit
from lightning_bandlimit.callbacks.ladder_coordinator import Coordinated
from lightning_bandlimit.callbacks.ladder_reading import held_bytes
from lightning_bandlimit.callbacks.shared_peers import PeerMemory
from lightning_bandlimit.ladder.reasons import HOLD, LOWER, RAISE
from lightning_bandlimit.ladder.setting import Decision, Setting
from lightning_bandlimit.tenants.arrival import Arrival, Event, Phase, advance
from lightning_bandlimit.tenants.coordination import Coordination
from lightning_bandlimit.tenants.entries import user_ids
from lightning_bandlimit.tenants.ledger import Ledger, Tenant, host_device
from lightning_bandlimit.tenants.offer import offer
from lightning_bandlimit.tenants.trust import bound_claims
from lightning_bandlimit.utils.validation import check_bool, check_real

__all__ = ["ARRIVAL_POLL_S", "SharedDevice"]

# seconds between an arriving job's reads of the ledger while it waits for room (a choice, not a
# measure: the wait ends within 50 ms of the last confirmation, for twenty reads of a few small
# files a second)
ARRIVAL_POLL_S = 0.05


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
    jobs, then splits, then rungs, one job at a time. A job with no peers behaves exactly as
    without this callback; a tenant without it counts as a co-tenant. The entries are grouped by
    device: a GPU's UUID (``torch.cuda.get_device_properties``), or the host on CPU.

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
    waits for it. The job's place in that protocol is one state, :attr:`arrival`
    (:class:`~lightning_bandlimit.tenants.arrival.Arrival`: its states and events in one table).

    What the peers hold is not others' growth to a job's ladder: on a GPU each peer counts at
    NVML's per-process memory (:meth:`~lightning_bandlimit.memory.MemoryProbe.process_memory`: its
    CUDA context and allocator cache too, which its own peak leaves out), else at the peak it
    published; the ledger carries intent. Where NVML's process ids are not the jobs' own (a
    container), the published peaks are used, said once
    (:mod:`~lightning_bandlimit.callbacks.shared_peers`).

    Each hold is kept in :attr:`holds` (step, the decision held, why) and said once per reason.
    With ``coordinate=False`` the job only publishes its entry (its process id lets CPU jobs
    measure each other's memory) and decides alone.

    Args:
        folder: a folder every job of the device can write.
        job: this job's name on the device (default: a unique one; under DDP the rank is added).
        coordinate: apply the shared rule (``False``: publish only).
        dwell: seconds after a peer's change during which a job holds.
        patience: checks a job holds in all over one shortfall (and in a row on release) before
            it moves anyway.
        timeout: seconds after which a silent peer is taken for dead.
        arrival_timeout: the most seconds an arriving job waits for its peers to make room.
        trusted_users: users (names or ids) besides the job's own whose ledger entries count
            (default: the job's own user's only).

    The ledger folder is untrusted input (:mod:`lightning_bandlimit.tenants.entries`): a file
    that does not hold up is skipped and named once. A write that fails (a read-only folder, a
    full disk) never stops the job: it says so once, decides alone meanwhile and tries again at
    its next heartbeat. Its entry is removed at the end of the fit, on an exception and at the
    interpreter's exit.

    Raises:
        ValueError: for a negative ``dwell`` or ``arrival_timeout``, a ``patience`` below 1, a
            non-positive ``timeout`` or a ``trusted_users`` entry that is no user;
            in ``setup``, if the trainer has no :class:`AdaptiveBandLimit`, or if a live job of
            another process runs under this job's name on the device (both named).

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
        trusted_users: Iterable[str | int] | None = None,
    ) -> None:
        super().__init__()
        self.folder, self.job = Path(folder), job
        self.trusted_users = tuple(trusted_users or ())
        user_ids(self.trusted_users)  # a user that is none is said now
        self.coordinate = check_bool("coordinate", coordinate)
        self.timeout = check_real("timeout", timeout, minimum=0, min_open=True)
        self.arrival_timeout = check_real("arrival_timeout", arrival_timeout, minimum=0)
        self.rule = Coordination(
            dwell, patience, arrival_timeout=self.arrival_timeout, lossy_timeout=self.timeout
        )
        self.ledger: Ledger | None = None
        self.holds: list[dict[str, Any]] = []
        self._adaptive: AdaptiveBandLimit | None = None
        self._changed_at = 0.0
        self._said: str | None = None
        self._peers = PeerMemory()  # the peers' memory a check reads, kept for its decision
        self.arrival = Arrival()  # the job's state in the arrival protocol

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
        trusted, warn = self.trusted_users, rank_zero_warn
        ledger = Ledger(self.folder, key, job=job, timeout=self.timeout, trusted_users=trusted, warn=warn)
        ledger.claim()  # another live job under this name: refused before training
        self.ledger = ledger
        self._publish()
        atexit.register(self._leave)  # the entry goes at the interpreter's exit, whatever ends the fit

    def _publish(self, setting: Setting | None = None) -> Tenant:
        """Write this job's entry at ``setting`` (default: the one it runs at,
        :attr:`AdaptiveBandLimit.setting`: its rung, the split it applied and its compression,
        so peers see and order its split as its rung), with what its ladder offers there
        (:func:`~lightning_bandlimit.tenants.offer.offer`)."""
        assert self.ledger is not None and self._adaptive is not None
        cb = self._adaptive
        entry = offer(cb.controller, cb.setting if setting is None else setting)
        return self.ledger.publish(  # type: ignore[arg-type]
            **entry, **self.arrival.ledger_fields(), coordinates=self.coordinate, changed_at=self._changed_at
        )

    @override
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._adaptive is not None and self.ledger is not None:
            self.arrive(trainer, held_bytes(self._adaptive.probe, trainer.strategy.root_device))

    def first_step_on_top(self) -> bool:
        """Whether the job's first step runs on its top rung: it arrived beside coordinating peers."""
        return self.arrival.first_step_on_top

    def arrive(self, trainer: pl.Trainer, held_bytes: int) -> bool:
        """Announce the job (holding ``held_bytes``) to its coordinating peers before its first
        step, and wait up to ``arrival_timeout`` seconds for each measured peer to confirm room;
        ``True`` (run that step on the top rung) when there are such peers."""
        assert self.ledger is not None
        announces = self.coordinate and trainer.world_size == 1
        if not announces or not any(p.coordinates for p in self.ledger.peers()):
            self.arrival = advance(self.arrival, Event.STARTED_UNANNOUNCED)
            return False
        self.arrival = advance(self.arrival, Event.ANNOUNCED, held_bytes=held_bytes)
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
            if self.ledger.beat_due():
                self.ledger.beat()  # still here, still arriving
            time.sleep(ARRIVAL_POLL_S)

    def peer_memory(self) -> float | None:
        """The live peers' memory (bytes), read at a check before the ladder decides: a peer's
        own change is not others' growth to the ladder. Each peer counts at what the device
        measures for its process where the probe can tell (NVML's per-process memory: its
        context, cache and tensors, from before its first step), else at the peak it published
        (:class:`~.shared_peers.PeerMemory`). ``None`` when a peer's is unknown; ``0`` with no
        peers."""
        assert self.ledger is not None
        return self._peers.read(self.ledger, self._adaptive.probe if self._adaptive is not None else None)

    def __call__(self, adaptive: AdaptiveBandLimit, trainer: pl.Trainer, decision: Decision) -> Coordinated:
        """The check's decision after the shared rule (what ``AdaptiveBandLimit`` applies), and
        whether it is a change the ladder did not decide (room made for an arrival, a refit)."""
        assert self.ledger is not None
        # read once, by peer_memory; a check without it measured no process
        peers, measured = self._peers.take(self.ledger)
        if self.arrival.phase is Phase.ARRIVING:
            self.arrival = advance(self.arrival, Event.FIRST_STEP_RAN)  # measured now: arrived
        me, at = self._publish(), time.time()
        outside = False
        if self.coordinate:
            # trust bounded: claims by what the device measures, arrivals by the time they take
            peers = self.rule.expire(bound_claims(peers, measured), at)
            coordinated, why, outside = self._coordinate(adaptive, trainer, decision, me, peers, at)
            self._say(adaptive, trainer, decision, coordinated, why)
            decision = coordinated
        if decision.setting != adaptive.setting:  # peers see the change (and dwell) at once
            self._changed_at = at
        room = self.arrival.ledger_fields()
        if decision.setting != adaptive.setting or (room["room_for"], room["making_room"]) != (
            me.room_for,
            me.making_room,
        ):
            self._publish(decision.setting)  # a change, or the room this check confirmed
        return Coordinated(decision, outside)

    def _coordinate(
        self,
        adaptive: AdaptiveBandLimit,
        trainer: pl.Trainer,
        decision: Decision,
        me: Tenant,
        peers: list[Tenant],
        at: float,
    ) -> tuple[Decision, str | None, bool]:
        """The decision after the shared rule, why it changed (``None``: not changed), and whether
        it is a change the ladder did not decide; the check's event goes to :attr:`arrival`."""
        ddp = trainer.world_size > 1
        outside = False
        if not ddp and any(p.arriving for p in peers) and decision.reason != RAISE:
            coordinated, room_for, why = self.rule.arrivals(
                decision, adaptive.setting, me, peers, at, adaptive.controller
            )
            moved = coordinated.setting != adaptive.setting
            if coordinated.reason == RAISE and moved:
                self.arrival = advance(self.arrival, Event.MOVED_FOR_ROOM)
            else:
                self._confirm(room_for)
            return coordinated, why, moved  # a move for an arrival: not the ladder's
        # under DDP a job makes no room for arrivals (its ranks move together, on a raise or a
        # release): nothing of it to wait for, so it confirms at once, as a job with no exact rung
        # left does (else an arrival would wait its timeout for it, and a peer leaving it the room
        # would make none)
        self._confirm(tuple(p.job for p in peers if p.arriving) if ddp else ())
        coordinated, why = self.rule.decide(decision, adaptive.setting, me, peers, at)
        if self.arrival.refit_pending and not ddp:
            coordinated, why, outside = self._give_back(adaptive, coordinated, why, peers, at)
        if ddp and decision.reason in (RAISE, LOWER):
            # every rank applies the same: a raise if any rank raises, a release if all do
            hold = trainer.strategy.reduce_boolean_decision(why is not None, all=decision.reason == RAISE)
            coordinated, why = (coordinated, why) if hold else (decision, None)
        return coordinated, why, outside

    def _confirm(self, room_for: tuple[str, ...]) -> None:
        """The check confirmed room for ``room_for`` (none when empty)."""
        event = Event.ROOM_CONFIRMED if room_for else Event.NO_ROOM_CONFIRMED
        self.arrival = advance(self.arrival, event, room_for=room_for)

    def _say(
        self,
        adaptive: AdaptiveBandLimit,
        trainer: pl.Trainer,
        decision: Decision,
        coordinated: Decision,
        why: str | None,
    ) -> None:
        """Keep a held decision in :attr:`holds` and say why, once per reason."""
        if why is None:
            return
        said = why
        if coordinated.setting == adaptive.setting and decision.reason != HOLD:
            self.holds.append({"step": trainer.global_step, "held": decision.reason, "why": why})
            said = f"{decision.reason} held: {why}"
        if why != self._said:
            rank_zero_info(f"SharedDevice: step {trainer.global_step}: {said}")
        self._said = why

    def _give_back(
        self, adaptive: AdaptiveBandLimit, decision: Decision, why: str | None, peers: list[Tenant], at: float
    ) -> tuple[Decision, str | None, bool]:
        """The top rung an arrival started on, refitted by a twin's measure (once; a change the
        ladder decides itself ends the need), and whether it was (a change the ladder did not
        decide)."""
        if decision.reason != HOLD:
            if decision.setting != adaptive.setting:
                self.arrival = advance(self.arrival, Event.LADDER_MOVED)
            return decision, why, False
        refitted, because = self.rule.refit(decision, adaptive.setting, peers, at, adaptive.controller)
        if because is None:
            return decision, why, False
        self.arrival = advance(self.arrival, Event.REFITTED)
        return refitted, because, True

    @override
    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        last = self.ledger.last if self.ledger is not None else None
        if last is None or self._adaptive is None:
            return
        if self.arrival.phase is Phase.ARRIVING:  # the first step ran (and no check read it): arrived
            self.arrival = advance(self.arrival, Event.FIRST_STEP_RAN)
            self._publish()
            return
        if last.setting_differs(self._adaptive.setting) or self.ledger.beat_due():  # type: ignore[union-attr]
            self._publish()  # a change no check decided (an out-of-memory retry), or the heartbeat

    @override
    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._leave()
        if self._adaptive is not None and self._adaptive.coordinator is self:
            self._adaptive.coordinator = None

    @override
    def on_exception(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException
    ) -> None:
        self._leave()  # a failed fit leaves the ledger too: its peers stop counting it at once

    def _leave(self) -> None:
        """Remove the job's entry (once; a failure to remove is ignored)."""
        if self.ledger is not None:
            self.ledger.leave()
            self.ledger = None
        atexit.unregister(self._leave)

    @override
    def state_dict(self) -> dict[str, Any]:
        return {"rule": self.rule.state_dict(), "refit": self.arrival.refit_pending}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.rule.load_state_dict(state_dict.get("rule", {}))
        phase = Phase.ON_TOP if state_dict.get("refit", False) else Phase.SETTLED
        self.arrival = Arrival(phase, room=self.arrival.room, room_for=self.arrival.room_for)
