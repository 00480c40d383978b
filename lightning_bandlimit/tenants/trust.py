"""Bounded trust: what a peer's entry claims counts no further than the device and the clock show.

A peer's entry is read from a folder anyone sharing the device can write, so the shared rule
(:mod:`lightning_bandlimit.tenants.coordination`) bounds what it takes from one:

* **Claims by the device**: where the device measures a peer's process (NVML's per-process
  memory), the bytes the peer's next move is predicted to free, and what it holds while
  arriving, count at most that (:func:`bound_claims`): a move cannot free more than the process
  holds.
* **Arrivals by the time they take**: a peer seen arriving for longer than a newcomer waits for
  room and runs its first step (``arrival_timeout`` and :data:`FIRST_STEP_S`) is taken to have
  arrived, whatever its heartbeat says (:meth:`Expiry.arrivals`).
* **Lossy holds by the time they keep**: a peer's lossy lever that has kept this job's exact rung
  on release for longer than ``lossy_timeout`` seconds, and more than ``patience`` checks, no
  longer keeps it (:meth:`Expiry.lossy_keeping`).

(A wait for peers under a shortfall is bounded in total, by ``patience`` checks: that count is
:meth:`~lightning_bandlimit.tenants.Coordination.decide`'s.)
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import replace

from lightning_bandlimit.tenants.ledger import Tenant

__all__ = ["ARRIVAL_TIMEOUT_S", "FIRST_STEP_S", "LOSSY_HOLD_TIMEOUT_S", "Expiry", "bound_claims"]

# seconds a newcomer waits for room at most: SharedDevice's default ``arrival_timeout``
ARRIVAL_TIMEOUT_S = 30.0

# seconds allowed for a newcomer's first step after its wait, before a peer seen arriving for
# ``arrival_timeout`` and this long is taken to have arrived (a choice, not a measure: a first
# step, with its allocator's warm-up, takes seconds; one under a compiler, longer)
FIRST_STEP_S = 30.0

# seconds a peer's lossy lever may keep this job's exact rung on release before it no longer
# does: the ledger's default ``timeout`` (a choice: a peer that has not given its compression back
# after that long beside a job with room to give is stuck or does not follow the rule)
LOSSY_HOLD_TIMEOUT_S = 120.0


def bound_claims(peers: Sequence[Tenant], measured: Mapping[int, int]) -> list[Tenant]:
    """``peers``, each one whose process the device measures (``measured``: bytes by process
    id, NVML's per-process memory) claiming at most that: a move cannot free more than the
    process holds (``next_freed``; an unknown saving, taken to cover any shortfall, counts as
    that too), nor does an arriving job hold more than it (``held``). Others unchanged.

    Example:
        >>> big = Tenant("a", 7, 0.0, exact_left=True, next_freed=2.0**40, next_lossy=False)
        >>> bound_claims([big], {7: 3_000_000})[0].next_freed  # claims 1 TiB, holds 3 MB
        3000000.0
        >>> bound_claims([big], {8: 3_000_000})[0].next_freed == 2.0**40  # not measured: as claimed
        True
    """
    bounded = []
    for peer in peers:
        most = measured.get(peer.pid)
        if most is not None:
            changes: dict[str, object] = {}
            if peer.next_lossy is not None and (peer.next_freed is None or peer.next_freed > most):
                changes["next_freed"] = float(most)
            if peer.held is not None and peer.held > most:
                changes["held"] = int(most)
            peer = replace(peer, **changes) if changes else peer  # type: ignore[arg-type]
        bounded.append(peer)
    return bounded


class Expiry:
    """When this job first saw each peer arriving, and since when (and for how many checks)
    each lossy peer has kept its exact rung on release: the clocks by which those claims expire.
    A job's own (nothing of it is published); a peer is tracked by its job's name."""

    def __init__(self) -> None:
        self.arriving_since: dict[str, float] = {}  # a peer's name: when this job first saw it arrive
        # a lossy peer's name: when it first kept this job's exact rung, and the checks it kept it
        self.lossy_since: dict[str, tuple[float, int]] = {}

    def arrivals(self, peers: Sequence[Tenant], at: float, timeout: float) -> list[Tenant]:
        """``peers``, each one seen arriving for longer than ``timeout`` and :data:`FIRST_STEP_S`
        seconds before ``at`` taken to have arrived (``arriving`` off, nothing ``held``). The
        time counts from the first check that saw it arriving; a peer seen not arriving (or
        gone) is counted afresh when it arrives again.

        Example:
            >>> expiry = Expiry()
            >>> forged = Tenant("x", 1, float("inf"), arriving=True, held=10)
            >>> [p.arriving for p in expiry.arrivals([forged], 100.0, timeout=30.0)]  # first seen
            [True]
            >>> [p.arriving for p in expiry.arrivals([forged], 161.0, timeout=30.0)]  # 61 s on
            [False]
        """
        names = {p.job for p in peers if p.arriving}
        self.arriving_since = {k: v for k, v in self.arriving_since.items() if k in names}
        bounded = []
        for peer in peers:
            if peer.arriving:
                since = self.arriving_since.setdefault(peer.job, at)
                if at - since > timeout + FIRST_STEP_S:
                    peer = replace(peer, arriving=False, held=None)
            bounded.append(peer)
        return bounded

    def lossy_seen(self, lossy: Collection[str], short: bool) -> None:
        """A check saw ``lossy`` peers compress: the others' clocks end, and all of them under a
        shortfall (``short``: a compression is called for, its time counts afresh after)."""
        self.lossy_since = {} if short else {k: v for k, v in self.lossy_since.items() if k in lossy}

    def lossy_keeping(self, peers: Sequence[Tenant], at: float, timeout: float, patience: int) -> list[str]:
        """The lossy ``peers`` that still keep this job's exact rung on release, a check at
        ``at`` asking: those that have kept it no longer than ``timeout`` seconds or no more
        than ``patience`` checks (an honest peer's own release takes a few of its checks)."""
        keeping = []
        for peer in peers:
            if not peer.lossy:
                continue
            since, checks = self.lossy_since.get(peer.job, (at, 0))
            self.lossy_since[peer.job] = (since, checks + 1)
            if at - since <= timeout or checks + 1 <= patience:
                keeping.append(peer.job)
        return keeping
