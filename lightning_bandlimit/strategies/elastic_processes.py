"""The elastic strategy's processes: how each starts, watches its peers and stops.

:class:`ElasticProcesses` is the side of
:class:`~lightning_bandlimit.strategies.ElasticDDPStrategy` that deals with its processes rather
than with training, from the launch to the teardown:

* **Nodes** (:func:`nodes_in_world`): under ``torchrun --nnodes=MIN:MAX`` the node count is only
  known when the group forms; it is read from the world size torchrun gives before Lightning
  configures its launcher, so that the ranks follow the nodes that joined.
* **Forming the group**: within ``join_timeout`` under torchrun (``join_deadline``: past it the
  process exits with status 75 and torchrun restarts the group), in a namespace of its own when
  torchrun's store is shared (``health.round_store``), and closed at exit on every rank
  (``health.exit``).
* **CPU threads** (:func:`cpu_threads_per_process`, :func:`set_cpu_threads`): the processes on a
  node share its cores; by default each takes ``cores // local processes`` intra-op threads (at
  least one), so that two processes on two cores do not run four threads.
* **Peers** (``peer_health``): the hang watchdog from the group's forming to the teardown, each
  forward timed, the ranks' times gathered at each optimizer-step boundary (a straggler reported,
  or dropped).
* **Stopping** (``preemption``): while training runs SIGTERM only sets a flag; at each
  optimizer-step boundary the ranks agree on it and all stop there with status 143.

The step boundaries are the strategy's bookkeeping
(:class:`~lightning_bandlimit.strategies.elastic_progress.ElasticProgress`).
"""

from __future__ import annotations

import os
from typing import Any

import torch
from lightning.fabric.plugins.environments import TorchElasticEnvironment
from lightning.pytorch.utilities import rank_zero_info

from lightning_bandlimit.health.exit import close_at_exit
from lightning_bandlimit.health.round_store import agent_store_shared, init_in_round_namespace
from lightning_bandlimit.strategies._lightning import LauncherHook, process_group_settings
from lightning_bandlimit.strategies.elastic_progress import ElasticProgress
from lightning_bandlimit.strategies.join_deadline import JoinDeadline
from lightning_bandlimit.strategies.peer_health import PeerHealth
from lightning_bandlimit.strategies.preemption import Preemption
from lightning_bandlimit.utils.validation import check_int, check_real

__all__ = ["ElasticProcesses", "cpu_threads_per_process", "nodes_in_world", "set_cpu_threads"]


def nodes_in_world(world_size: int, processes_per_node: int, nodes: int) -> int | None:
    """The node count a world of ``world_size`` processes means, if it is not ``nodes``.

    Args:
        world_size: the processes in the group, as torchrun says.
        processes_per_node: the processes each node runs.
        nodes: the node count the strategy has now.

    Returns:
        The new node count; ``None`` to keep ``nodes`` (the same count, a world that is not
        whole nodes, or no processes per node yet).

    Example:
        >>> nodes_in_world(8, processes_per_node=4, nodes=1)
        2
        >>> nodes_in_world(4, 4, 1), nodes_in_world(6, 4, 1), nodes_in_world(4, 0, 1)
        (None, None, None)
    """
    if not processes_per_node or world_size % processes_per_node:
        return None
    return world_size // processes_per_node if world_size // processes_per_node != nodes else None


def cpu_threads_per_process(requested: int | None, cores: int, local_processes: int) -> int | None:
    """The intra-op threads a process on CPU uses.

    Args:
        requested: the threads asked for; ``None``: ``cores // local_processes`` (at least one);
            ``0``: leave torch's setting alone.
        cores: the cores this process may run on.
        local_processes: the processes sharing them (this node's).

    Returns:
        The threads; ``None`` to leave torch's setting alone.

    Example:
        >>> cpu_threads_per_process(None, cores=16, local_processes=4)
        4
        >>> [cpu_threads_per_process(requested, cores=2, local_processes=4) for requested in (None, 3, 0)]
        [1, 3, None]
    """
    if requested == 0:
        return None
    return requested or max(1, cores // max(1, local_processes))


def set_cpu_threads(requested: int | None, local_processes: int) -> str | None:
    """Set this process's intra-op threads by :func:`cpu_threads_per_process`; what was set.

    Args:
        requested: as for :func:`cpu_threads_per_process`.
        local_processes: the processes on this node when ``LOCAL_WORLD_SIZE`` (torchrun's) is
            not set.

    Returns:
        One line saying the threads and local processes; ``None`` if ``requested`` is 0 (nothing set).
    """
    if requested == 0:
        return None
    local = int(os.environ.get("LOCAL_WORLD_SIZE", local_processes))
    threads = cpu_threads_per_process(requested, len(os.sched_getaffinity(0)), local)
    assert threads is not None
    torch.set_num_threads(threads)
    return f"ElasticDDPStrategy: {threads} CPU threads per process ({local} local processes)"


class ElasticProcesses(LauncherHook, PeerHealth):
    """Mixin of :class:`~lightning_bandlimit.strategies.ElasticDDPStrategy` (before the Lightning
    strategy in its bases): its processes' start, peers and stop, in Lightning's hooks.

    The strategy calls :meth:`_init_processes` and :meth:`_init_health` from its ``__init__`` and
    keeps its bookkeeping in ``_progress``; every hook here calls the next one in line
    (``super()``) at the point Lightning expects.
    """

    _progress: ElasticProgress
    num_processes: int
    num_nodes: int
    root_device: torch.device

    def _init_processes(self, cpu_threads: int | None, join_timeout: float | None) -> None:
        if cpu_threads is not None:
            check_int("cpu_threads", cpu_threads, minimum=0)  # None: auto, 0: leave torch alone
        if join_timeout is not None:
            join_timeout = check_real("join_timeout", join_timeout, minimum=0.0, min_open=True)
        self.cpu_threads = cpu_threads
        self.join_timeout = join_timeout
        self._preemption = Preemption(agree=lambda local: self.reduce_boolean_decision(local, all=False))  # type: ignore[attr-defined]

    def before_launcher(self) -> None:
        # Under torchrun --nnodes=MIN:MAX the node count is only known at each (re)start.
        if isinstance(self.cluster_environment, TorchElasticEnvironment):
            world = self.cluster_environment.world_size()
            nodes = nodes_in_world(world, self.num_processes, self.num_nodes)
            if nodes is not None:
                self.num_nodes = nodes
                self.set_world_ranks()  # type: ignore[attr-defined]

    def setup_environment(self) -> None:
        elastic = isinstance(self.cluster_environment, TorchElasticEnvironment)
        with JoinDeadline(self.join_timeout if elastic else None, "the process group"):
            super().setup_environment()  # type: ignore[misc]
        close_at_exit()
        self._start_health()
        if self.root_device.type == "cpu" and (said := set_cpu_threads(self.cpu_threads, self.num_processes)):
            rank_zero_info(said)

    def setup_distributed(self) -> None:
        if agent_store_shared() and not torch.distributed.is_initialized():  # see health/round_store.py
            self.set_world_ranks()  # type: ignore[attr-defined]
            backend, timeout = process_group_settings(self)  # type: ignore[arg-type]
            device = self.root_device if self.root_device.type != "cpu" else None
            init_in_round_namespace(backend, self.global_rank, self.world_size, timeout, device)
        # the rest of Lightning's set-up (it sees the group formed)
        super().setup_distributed()  # type: ignore[misc]

    def configure_ddp(self) -> None:
        super().configure_ddp()  # type: ignore[misc]
        self._attach_forward_timer()

    def on_train_start(self) -> None:
        super().on_train_start()  # type: ignore[misc]
        self._preemption.install()  # after Lightning's handlers, which it replaces while training

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        super().on_train_batch_start(batch, batch_idx)  # type: ignore[misc]
        step = self.lightning_module.trainer.global_step  # type: ignore[attr-defined]
        self._health_step(step)
        if self._progress.at_step_boundary:  # the ranks' forward times meet here
            self._health_step_end(step)
            if self._progress.started:  # a SIGTERM stops every rank here
                self._preemption.check()

    def backward(self, closure_loss: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        self._health_forward_end()
        return super().backward(closure_loss, *args, **kwargs)  # type: ignore[misc]

    def teardown(self) -> None:
        self._stop_health()
        self._preemption.uninstall()
        super().teardown()  # type: ignore[misc]
