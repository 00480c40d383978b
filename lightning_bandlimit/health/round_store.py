"""A fresh namespace in torchrun's shared store for each restart of the group.

Since torch 2.4, torchrun's agent hosts one TCP store for the whole run and its workers use it to
form their process group (``TORCHELASTIC_USE_AGENT_STORE=True``). The store outlives the workers,
so after a restart the new workers find the keys their predecessors wrote: a rank that reaches
``init_process_group`` before its peer reads the peer's *old* address and connects to a dead
port (gloo: ``connectFullMesh ... Connection refused``; NCCL: an old unique id), every attempt
alike, until torchrun's restarts run out (pytorch/pytorch#135712). ``TORCHELASTIC_RESTART_COUNT``
cannot name the attempt: each agent counts its own restarts, so nodes disagree after a failure.

:func:`round_namespace` agrees on a fresh name by a handshake no stale key can complete: rank 0
publishes a new token; every other rank answers under the token it reads with a nonce of its own
and waits for rank 0 to echo that nonce. A token left by a dead rank 0 is never echoed, so the
rank reads the token again until the live rank 0's appears. :func:`round_store` wraps the store
in that namespace for ``init_process_group(store=...)``.
"""

from __future__ import annotations

import os
import time
import uuid
from datetime import timedelta

import torch
import torch.distributed as dist

__all__ = ["agent_store_shared", "init_in_round_namespace", "round_namespace", "round_store"]

_KEY = "lightning_bandlimit/round"


def agent_store_shared() -> bool:
    """Whether this worker forms its process group in torchrun's agent's store (kept across restarts).

    Example:
        >>> import os
        >>> agent_store_shared() == (os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True")
        True
    """
    return os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"


def round_namespace(store: dist.Store, rank: int, world_size: int, poll: float = 0.2) -> str:
    """A name every rank of this attempt agrees on and no earlier attempt used.

    Blocks until all ``world_size`` ranks have called it (bounded by the store's timeout).

    Args:
        store: the store the ranks share (possibly holding keys of earlier attempts).
        rank: this process's rank.
        world_size: the number of ranks.
        poll: seconds between a waiting rank's looks at the token and its answer.

    Returns:
        The token (32 hex digits) rank 0 published for this attempt.

    Raises:
        ValueError: if ``rank`` is not in ``[0, world_size)`` or ``poll`` is not positive.

    Example:
        >>> store = dist.HashStore()
        >>> len(round_namespace(store, 0, 1))
        32
    """
    if not 0 <= rank < world_size:
        raise ValueError(f"rank must be in [0, world_size={world_size}), got {rank}")
    if not poll > 0:
        raise ValueError(f"poll must be positive, got {poll}")
    if rank == 0:
        token = uuid.uuid4().hex
        store.set(f"{_KEY}/token", token)
        for peer in range(1, world_size):
            nonce = store.get(f"{_KEY}/{token}/ack/{peer}").decode()
            store.set(f"{_KEY}/{token}/ok/{nonce}", "1")
        return token
    nonce, answered = uuid.uuid4().hex, None
    while True:
        token = store.get(f"{_KEY}/token").decode()
        if token != answered:
            store.set(f"{_KEY}/{token}/ack/{rank}", nonce)
            answered = token
        if store.check([f"{_KEY}/{token}/ok/{nonce}"]):
            return token
        time.sleep(poll)  # not echoed (yet): a stale token, or rank 0 still on its way


def round_store(rank: int, world_size: int, timeout: timedelta) -> dist.Store:
    """The run's store (``env://``: ``MASTER_ADDR:MASTER_PORT``) in a namespace of this attempt's own.

    Args:
        rank: this process's rank.
        world_size: the number of ranks.
        timeout: the store's timeout (the process group's).

    Returns:
        A ``PrefixStore`` to pass to ``torch.distributed.init_process_group(store=...)``.
    """
    store, _, _ = next(dist.rendezvous("env://", rank=rank, world_size=world_size, timeout=timeout))
    return dist.PrefixStore(f"{_KEY}/{round_namespace(store, rank, world_size)}", store)


def init_in_round_namespace(
    backend: str, rank: int, world_size: int, timeout: timedelta, device_id: torch.device | None = None
) -> None:
    """``torch.distributed.init_process_group`` in :func:`round_store`'s namespace for this attempt.

    Args:
        backend: the process group's backend (``"gloo"``, ``"nccl"``).
        rank: this process's rank.
        world_size: the number of ranks.
        timeout: the process group's timeout (also the store's).
        device_id: the device to bind the group to (NCCL), or ``None``.
    """
    store = round_store(rank, world_size, timeout)
    dist.init_process_group(
        backend, rank=rank, world_size=world_size, timeout=timeout, store=store, device_id=device_id
    )
