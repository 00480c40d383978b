"""The strategy's side of a job's peers: a progress watchdog and a straggler report.

* **Hangs** (``hang_timeout``): from the process group's set-up on, a
  :class:`~lightning_bandlimit.health.heartbeat.PeerWatchdog` publishes this rank's heartbeat
  and step to the run's store (a client of its own to ``MASTER_ADDR:MASTER_PORT``, the store
  torchrun's agent or Lightning's rank 0 runs) and watches the peers'. A peer silent for
  ``hang_timeout`` (stopped, or its host gone) makes every rank that notices write which rank and
  which step and exit with status 75, so torchrun restarts the group from the last checkpoint and
  the resume path takes over; no rank waits for the collective's own timeout (30 minutes).
* **Stragglers** (``slow_factor``, ``slow_steps``): each rank times its forward pass after DDP's
  buffer broadcast (the one stretch of a step no rank waits for another in) and the ranks gather
  these once per optimizer step; a :class:`~lightning_bandlimit.health.stragglers.StragglerDetector`
  on every rank (the same figures, so the same verdict) flags a rank slower than the others for
  ``slow_steps`` steps, reported once. With ``drop_stragglers`` the straggler then leaves: every
  rank reached the same verdict at the same step boundary, so all stop there as on a pre-emption
  (an ``ElasticCheckpoint`` saves that step, status 143: nothing is redone) and the straggler,
  under torchrun, also ends its node's agent; the other agents restart their workers, which
  re-form without it and go on at the smaller world size by the existing resize rules.
"""

from __future__ import annotations

import os
import signal
import sys
import time
import uuid
import warnings
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from lightning.pytorch.utilities import rank_zero_info
from lightning.pytorch.utilities.exceptions import SIGTERMException

from lightning_bandlimit.health.exit import before_close
from lightning_bandlimit.health.hangs import Hang
from lightning_bandlimit.health.heartbeat import PeerWatchdog, exit_hung
from lightning_bandlimit.health.reap import identity, kill_if_local
from lightning_bandlimit.health.stragglers import Straggler, StragglerDetector
from lightning_bandlimit.strategies.preemption import EXIT_STATUS
from lightning_bandlimit.utils.validation import check_int, check_real

__all__ = ["PeerHealth"]

_PREFIX = "lightning_bandlimit/heartbeat"


class PeerHealth:
    """Mixin of :class:`~lightning_bandlimit.strategies.ElasticDDPStrategy`: hangs and stragglers.

    The strategy calls :meth:`_init_health` from its ``__init__``, :meth:`_start_health` after the
    process group forms, :meth:`_health_step` at each batch start, :meth:`_health_forward` around
    the forward and :meth:`_health_step_end` after each optimizer step, :meth:`_stop_health` in
    ``teardown``.
    """

    world_size: int
    global_rank: int
    cluster_environment: Any
    model: Any

    def _init_health(
        self,
        hang_timeout: float | None,
        slow_factor: float | None,
        slow_steps: int,
        drop_stragglers: bool,
    ) -> None:
        if hang_timeout is not None:
            hang_timeout = check_real("hang_timeout", hang_timeout, minimum=0.0, min_open=True)
        if slow_factor is not None:
            slow_factor = check_real("slow_factor", slow_factor, minimum=1.0, min_open=True)
        check_int("slow_steps", slow_steps, minimum=1)
        if not isinstance(drop_stragglers, bool):
            raise TypeError(f"drop_stragglers must be a bool, got {type(drop_stragglers).__name__}")
        if drop_stragglers and slow_factor is None:
            raise ValueError("drop_stragglers=True needs a slow_factor to find stragglers, got None")
        self.hang_timeout, self.slow_factor, self.slow_steps = hang_timeout, slow_factor, slow_steps
        self.drop_stragglers = drop_stragglers
        self.stragglers: list[Straggler] = []
        self._watchdog: PeerWatchdog | None = None
        self._where: list[str] = []
        self._detector = StragglerDetector(slow_factor, slow_steps) if slow_factor is not None else None
        self._forward_started: float | None = None
        self._forward_seconds = 0.0
        self._forward_hook: Any = None

    def _start_health(self) -> None:
        if self.hang_timeout is None or self.world_size < 2 or self._watchdog is not None:
            return
        # One key space per process group, the same on every rank (each torchrun agent counts its
        # own restarts, so TORCHELASTIC_RESTART_COUNT differs between nodes after a failure).
        run = self.broadcast(uuid.uuid4().hex if self.global_rank == 0 else None)  # type: ignore[attr-defined]
        self._where = [""] * self.world_size  # each rank's process, to end a hung one on this machine
        dist.all_gather_object(self._where, identity())
        try:
            env = self.cluster_environment
            client = dist.TCPStore(
                env.main_address,
                env.main_port,
                is_master=False,
                timeout=timedelta(seconds=self.hang_timeout),
                wait_for_workers=False,
            )
            store = dist.PrefixStore(f"{_PREFIX}/{run}", client)
            self._watchdog = PeerWatchdog(
                store, self.global_rank, self.world_size, self.hang_timeout, on_hang=self._on_hang
            )
            self._watchdog.start()
        except Exception as error:  # no watchdog is better than no job
            warnings.warn(
                f"ElasticDDPStrategy: the hang watchdog could not start ({error!r}); a hung peer will be "
                "waited for until the process group's timeout"
            )
            self._watchdog = None
            return
        before_close(self._watchdog.stop)

    def _on_hang(self, hang: Hang) -> None:
        """End a hung peer on this machine first (its agent would wait 30 s for it), then exit."""
        hung = hang.rank
        if hung is None and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
            hung = 0  # the silent store is rank 0's (Lightning's launcher, or torchrun not sharing its own)
        if hung is not None and hung != self.global_rank and kill_if_local(self._where[hung]):
            sys.stderr.write(f"[rank {self.global_rank}] ElasticDDPStrategy: SIGKILLed hung rank {hung}\n")
        exit_hung(hang)

    def _health_step(self, step: int) -> None:
        if self._watchdog is not None:
            self._watchdog.progress(step)

    def _attach_forward_timer(self) -> None:
        """Time the wrapped module's forward from after DDP's broadcast (a pre-hook inside DDP)."""
        if self._detector is None or self._forward_hook is not None or self.model is None:
            return
        inner = getattr(self.model, "module", self.model)

        def started(module: Any, args: Any) -> None:
            self._forward_started = time.perf_counter()

        self._forward_hook = inner.register_forward_pre_hook(started)

    def _health_forward_end(self) -> None:
        """The forward of a micro-batch ended (the strategy's ``backward`` begins)."""
        if self._forward_started is not None:
            self._forward_seconds += time.perf_counter() - self._forward_started
            self._forward_started = None

    def _health_step_end(self, step: int) -> None:
        """After an optimizer step: gather the ranks' forward times, report (and drop) a straggler."""
        if self._detector is None or self.world_size < 2:
            self._forward_seconds = 0.0
            return
        mine = torch.tensor([self._forward_seconds], dtype=torch.float64, device=self.root_device)  # type: ignore[attr-defined]
        self._forward_seconds = 0.0
        gathered = [torch.zeros_like(mine) for _ in range(self.world_size)]
        dist.all_gather(gathered, mine)
        seconds = [float(t.item()) for t in gathered]
        if min(seconds) <= 0.0:  # a rank that ran no forward since the last boundary (the first batch)
            return
        for straggler in self._detector.observe(step, seconds):
            self.stragglers.append(straggler)
            rank_zero_info(f"ElasticDDPStrategy: {straggler.message()}")
            if self.drop_stragglers:
                self._drop(straggler)

    def _drop(self, straggler: Straggler) -> None:
        """Stop every rank at this step as a pre-emption does; the straggler ends its agent too."""
        if straggler.rank == self.global_rank:
            sys.stderr.write(
                f"[rank {self.global_rank}] ElasticDDPStrategy: leaving the group at step {straggler.step} "
                f"as a straggler (drop_stragglers=True): {straggler.message()}\n"
            )
            sys.stderr.flush()
            if "TORCHELASTIC_RUN_ID" in os.environ:  # its agent ends: the group re-forms without it
                os.kill(os.getppid(), signal.SIGTERM)
        else:
            sys.stderr.write(
                f"[rank {self.global_rank}] ElasticDDPStrategy: stopping at step {straggler.step} so the "
                f"group re-forms without straggler rank {straggler.rank} (drop_stragglers=True)\n"
            )
        raise SIGTERMException(EXIT_STATUS)

    def _stop_health(self) -> None:
        if self._watchdog is not None:
            self._watchdog.done()
            self._watchdog.stop()
            self._watchdog = None
        if self._forward_hook is not None:
            self._forward_hook.remove()
            self._forward_hook = None
