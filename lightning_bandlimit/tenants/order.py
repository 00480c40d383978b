"""Which job's move comes first across a device's tenants, and which moves need no turn.

The shared rule (:class:`~lightning_bandlimit.tenants.coordination.Coordination`) lets a job's
decision through or holds it by the order of the moves its peers publish
(:class:`~lightning_bandlimit.tenants.ledger.Tenant`):

* **Under a shortfall** (:func:`why_hold_raise`): every exact move of every job before any job
  compresses, and among moves of one kind the cheapest first (:func:`move_order`: measured
  slowdown per GiB freed, then the most freed, then the job's name).
* **On release** (:func:`why_hold_release`): one job at a time, the one furthest up its ladder
  first (:func:`release_order`): the ladder climbs rungs, then splits on the top rung, then
  compression, so a job gives back in the reverse: its compression first, then its split, then
  its rung.
* **A peer's change not in the readings yet** goes first (:func:`changed_within`): a job whose
  peer changed within ``dwell`` seconds waits for it.
* **A move that frees nothing needs no turn** (:func:`same_memory`): going down from a rung
  measured idle to the rung below it (the same memory, faster).
"""

from __future__ import annotations

from collections.abc import Sequence

from lightning_bandlimit.ladder.reasons import LOWER
from lightning_bandlimit.ladder.setting import Decision
from lightning_bandlimit.tenants.ledger import Tenant
from lightning_bandlimit.utils.units import MIB

__all__ = [
    "changed_within",
    "move_order",
    "release_order",
    "same_memory",
    "why_hold_raise",
    "why_hold_release",
]


def move_order(tenant: Tenant) -> tuple[float, float, str]:
    """Which job's next move comes first: the cheapest (measured slowdown per GiB freed; a move
    not measured yet counts as free, to be measured), then the one predicted to free the most
    (among moves not measured yet: a stage's recompute costs about the same whichever it is, so
    the most freed is the least cost per byte, and the fewest moves), then the job's name.

    Example:
        >>> cheap = Tenant("b", 1, 0.0, next_cost=0.1, next_freed=10.0)
        >>> dear = Tenant("a", 1, 0.0, next_cost=0.5, next_freed=99.0)
        >>> [t.job for t in sorted([dear, cheap], key=move_order)]
        ['b', 'a']
    """
    return (tenant.next_cost or 0.0, -(tenant.next_freed or 0.0), tenant.job)


def release_order(tenant: Tenant) -> tuple[bool, float, int, int, str]:
    """Which job gives back first: the one furthest up its ladder, in the ladder's own order
    reversed: a lossy one first (the most compressed first), then the one in the most chunks
    (a split is taken on the top rung, after every rung), then the one on the highest rung,
    then the job's name.

    Example:
        >>> split = Tenant("b", 1, 0.0, rung=2, split=2)
        >>> high = Tenant("a", 1, 0.0, rung=3)
        >>> [t.job for t in sorted([high, split], key=release_order)]
        ['b', 'a']
    """
    return (not tenant.lossy, -tenant.compression, -tenant.split, -tenant.rung, tenant.job)


def changed_within(peers: Sequence[Tenant], at: float, dwell: float) -> str | None:
    """Why to wait for peers that changed within ``dwell`` seconds of ``at`` (``None``: none did):
    their change is not in the readings yet.

    Example:
        >>> changed_within([Tenant("a", 1, 0.0, changed_at=9.0)], at=10.0, dwell=5.0)
        'a changed within 5 s: not in the readings yet'
    """
    recent = [p.job for p in peers if at - p.changed_at < dwell]
    if not recent:
        return None
    return f"{', '.join(recent)} changed within {dwell:g} s: not in the readings yet"


def same_memory(decision: Decision, me: Tenant) -> bool:
    """Whether ``decision`` goes down from a rung measured idle (:attr:`Tenant.idle_from`, or
    one above it) to the rung below it, in the chunks it runs in: the same memory, faster,
    nothing for peers to weigh (from a split, the whole batch needs more)."""
    idle = me.idle_from
    return (
        decision.reason == LOWER
        and idle is not None
        and me.rung >= idle
        and decision.rung == idle - 1
        and decision.compression == me.compression
        and decision.split == me.split
    )


def why_hold_raise(decision: Decision, me: Tenant, peers: Sequence[Tenant]) -> str | None:
    """Why to hold a raise (``None``: no reason): a peer has an exact rung left and the move
    compresses, or cheaper moves of peers cover the shortfall (:func:`move_order`)."""
    lossy = decision.compression > me.compression or me.lossy  # my move compresses
    if lossy:
        exact = [p.job for p in peers if p.exact_left]
        if exact:
            return f"{', '.join(exact)} still have exact rungs: exact levers first, across jobs"
    deficit = max(0.0, float(decision.threshold - decision.free))
    mine = move_order(me)
    covered = 0.0
    cheaper = []
    for peer in sorted(peers, key=move_order):
        if peer.next_lossy is None or peer.next_lossy != lossy or move_order(peer) >= mine:
            continue
        cheaper.append(peer.job)
        covered = float("inf") if peer.next_freed is None else covered + peer.next_freed
        if covered >= deficit:
            return f"a cheaper move of {', '.join(cheaper)} covers the {deficit / MIB:.1f} MiB short"
    return None


def why_hold_release(me: Tenant, peers: Sequence[Tenant]) -> str | None:
    """Why to hold a release (``None``: no reason): a peer with something to give back (a
    compression, a split or a rung) gives back first, by :func:`release_order`."""
    mine = release_order(me)
    ahead = [p.job for p in peers if (p.lossy or p.split > 1 or p.rung > 0) and release_order(p) < mine]
    if ahead:
        return f"{', '.join(ahead)} give back first (one job at a time, the most lossy first)"
    return None
