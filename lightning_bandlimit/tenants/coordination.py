"""One ladder across a device's tenants: the cheapest lever across all jobs moves first.

Each job's controller decides from the device's free memory as if it were alone; its
:class:`Coordination` then looks at the same ledger snapshot as every other job and lets the
decision through or turns it into a hold, by one rule that every job applies alike (no job
waits for an answer from another):

* **Under a shortfall** a job moves when no cheaper move of another job covers it: every exact
  move of every job comes before any job compresses (a job whose next move is lossy holds while a
  peer has an exact rung left), and among moves of one kind the cheapest first (measured slowdown
  per GiB freed; among moves not measured yet the one predicted to free the most; then the
  job's name), each counting what it is predicted to free (a move whose
  saving is unknown is taken to cover the shortfall: it will be measured at the next check).
  A job whose peer changed within ``dwell`` seconds holds: that change is not in the readings
  yet (the remedy for controllers that react to one signal out of step).
* **On release** the lossy part goes first, across jobs (a job that would give back an exact
  rung holds while a peer is compressed), one job at a time: the most lossy first, then the one
  in the most chunks (a split), then the one on the highest rung (the ladder's order reversed).
  Which move comes first, in both directions, is :mod:`lightning_bandlimit.tenants.order`.
* **Never overdraw to be polite**: with nothing free (over budget) a job moves at once, and once
  it has held ``patience`` checks in total since a shortfall began (its own moves and its peers'
  do not start the count afresh; a check without a shortfall does) it moves whatever the others
  offer (but an exact rung is not given back while a peer compresses).
* **Trust is bounded** (:mod:`lightning_bandlimit.tenants.trust`): a peer's claim of what its
  next move frees counts at most what the device measures for its process; a peer seen arriving
  for longer than its wait and first step is taken to have arrived (:meth:`Coordination.expire`),
  whatever its heartbeat says; a lossy lever that has kept this job's exact rung for longer than
  ``lossy_timeout`` seconds (and more than ``patience`` checks) no longer keeps it.
* **Room for an arrival**: while a peer arrives (its first step, which measures it, not run
  yet), a job gives nothing back and makes room for it by exact rungs, one job at a time, the
  cheapest first (:meth:`Coordination.arrivals`, :mod:`lightning_bandlimit.tenants.room`); the
  newcomer's top rung, taken before anything of it was measured, goes down once to what a run
  of its model measured to fit (:meth:`Coordination.refit`,
  :mod:`lightning_bandlimit.tenants.refit`). The protocol's states, events and the room it makes
  are in :mod:`lightning_bandlimit.tenants.arrival` (one table).
* **A rung that frees nothing is not given**: going down from a rung measured idle to the one
  below it, in the same chunks, is let through at once, arrival or not (the same memory,
  faster).

A job with no peers is let through unchanged, as is every hold: alone, a job behaves exactly as
without the ledger. What each job publishes for the others to weigh is
:func:`~lightning_bandlimit.tenants.offer.offer`.
"""

from __future__ import annotations

from collections.abc import Sequence

from lightning_bandlimit.ladder.controller import LadderController
from lightning_bandlimit.ladder.reasons import HOLD, LOWER, RAISE
from lightning_bandlimit.ladder.setting import Decision, Setting
from lightning_bandlimit.tenants.ledger import Tenant
from lightning_bandlimit.tenants.order import changed_within, same_memory, why_hold_raise, why_hold_release
from lightning_bandlimit.tenants.refit import refit
from lightning_bandlimit.tenants.room import room_for_arrivals
from lightning_bandlimit.tenants.trust import ARRIVAL_TIMEOUT_S, LOSSY_HOLD_TIMEOUT_S, Expiry
from lightning_bandlimit.utils.validation import check_int, check_real

__all__ = ["Coordination"]


class Coordination:
    """Lets a job's decisions through, or holds them, by the rule of the module docstring.

    Args:
        dwell: seconds after a peer's change during which a job holds (its effect is not in the
            readings yet).
        patience: checks a job holds in total under one shortfall before it moves anyway (on
            release: in a row, until its own move).
        arrival_timeout: the most seconds a newcomer waits for room: a peer this job has seen
            arriving for longer than that and
            :data:`~lightning_bandlimit.tenants.trust.FIRST_STEP_S` is taken to have arrived
            (:meth:`expire`).
        lossy_timeout: seconds a peer's lossy lever may keep this job's exact rung on release
            (it must also have kept it more than ``patience`` checks) before it no longer does.

    Raises:
        ValueError: for a negative ``dwell``, ``arrival_timeout`` or ``lossy_timeout``, or a
            ``patience`` below 1.

    Example:
        >>> rule = Coordination(dwell=0.0)
        >>> me = Tenant("b", 2, 0.0, exact_left=True, next_freed=64.0, next_lossy=False)
        >>> peer = Tenant("a", 1, 0.0, exact_left=True, next_freed=64.0, next_lossy=False)
        >>> squeeze = Decision(1, 0.0, "raise", free=50, threshold=100)  # 50 bytes short
        >>> rule.decide(squeeze, Setting(0, 0.0), me, [peer], at=1.0)[0].reason  # a's move covers it
        'hold'
        >>> rule.decide(squeeze, Setting(0, 0.0), me, [], at=1.0)[0].reason  # alone
        'raise'
    """

    def __init__(
        self,
        dwell: float = 0.0,
        patience: int = 3,
        arrival_timeout: float = ARRIVAL_TIMEOUT_S,
        lossy_timeout: float = LOSSY_HOLD_TIMEOUT_S,
    ) -> None:
        self.dwell = check_real("dwell", dwell, minimum=0)
        self.patience = check_int("patience", patience, minimum=1)
        self.arrival_timeout = check_real("arrival_timeout", arrival_timeout, minimum=0)
        self.lossy_timeout = check_real("lossy_timeout", lossy_timeout, minimum=0)
        self.held_checks = 0  # checks held under this shortfall (out of one: in a row, on release)
        self.short = False  # whether the last check decided was under a shortfall
        self.expiry = Expiry()  # when peers were first seen arriving, or keeping a rung by a lossy lever

    def decide(
        self, decision: Decision, current: Setting, me: Tenant, peers: Sequence[Tenant], at: float
    ) -> tuple[Decision, str | None]:
        """``decision`` or a hold at ``current``, and why it was held (``None``: let through);
        ``at``: the time of the check (the ledger's clock). Holds are counted over a whole
        shortfall, not per move: a peer always offering a cheaper move holds the job ``patience``
        checks in all."""
        short = decision.free < decision.threshold
        if short != self.short:  # a shortfall began or ended: the wait is counted afresh
            self.held_checks, self.short = 0, short
        self.expiry.lossy_seen({p.job for p in peers if p.lossy}, short)
        why, firm = (None, False) if not peers else self._why_hold(decision, me, peers, at)
        if why is not None and not firm:
            self.held_checks += 1
            if (decision.reason == RAISE and decision.free <= 0) or self.held_checks > self.patience:
                why = None  # never overdraw to be polite, nor wait on a peer for ever
        if why is None:
            if decision.reason != HOLD and not short:
                self.held_checks = 0  # a release let through; under a shortfall the count goes on
            return decision, None
        return Decision.at(current, HOLD, decision.free, decision.threshold), why

    def expire(self, peers: Sequence[Tenant], at: float) -> list[Tenant]:
        """``peers``, each one this job has seen arriving for longer than ``arrival_timeout`` (and a
        first step's time) before ``at`` taken to have arrived, whatever its heartbeat says: an
        entry claiming to arrive for ever no longer stops this job giving back
        (:meth:`~lightning_bandlimit.tenants.trust.Expiry.arrivals`)."""
        return self.expiry.arrivals(peers, at, self.arrival_timeout)

    def _why_hold(
        self, decision: Decision, me: Tenant, peers: Sequence[Tenant], at: float
    ) -> tuple[str | None, bool]:
        """Why to hold (``None``: no reason) and whether the hold is firm (patience does not end
        it: an exact rung kept while a peer compresses)."""
        if decision.reason not in (RAISE, LOWER) or same_memory(decision, me):
            return None, False
        if (recent := changed_within(peers, at, self.dwell)) is not None:
            return recent, False
        if decision.reason == RAISE:
            return why_hold_raise(decision, me, peers), False
        if not me.lossy and any(p.lossy for p in peers):
            keeping = self.expiry.lossy_keeping(peers, at, self.lossy_timeout, self.patience)
            if keeping:
                lossy = ", ".join(keeping)
                return f"{lossy} still compress: lossy levers are given back first, across jobs", True
            expired = set(self.expiry.lossy_since)
            peers = [p for p in peers if p.job not in expired]  # their turn has passed
        return why_hold_release(me, peers), False

    def arrivals(
        self,
        decision: Decision,
        current: Setting,
        me: Tenant,
        peers: Sequence[Tenant],
        at: float,
        controller: LadderController,
    ) -> tuple[Decision, tuple[str, ...], str | None]:
        """``decision`` while peers arrive, the arrivals this check confirms room for, and why it
        changed (``None``: not changed): :func:`~lightning_bandlimit.tenants.room.room_for_arrivals`
        with this rule's ``dwell``; ``at``: the time of the check. The protocol's steps:
        :mod:`lightning_bandlimit.tenants.arrival`."""
        return room_for_arrivals(decision, current, me, peers, at, controller, self.dwell)

    def refit(
        self,
        decision: Decision,
        current: Setting,
        peers: Sequence[Tenant],
        at: float,
        controller: LadderController,
    ) -> tuple[Decision, str | None]:
        """An arrival's top rung (or a split on it) given back to the fastest exact point a run
        of its model measured to fit, the decision carrying its split, and why (``None``:
        ``decision`` unchanged): :func:`~lightning_bandlimit.tenants.refit.refit` with this
        rule's ``dwell``; ``at``: the time of the check."""
        return refit(decision, current, peers, at, controller, self.dwell)

    def state_dict(self) -> dict[str, int]:
        return {"held_checks": self.held_checks, "short": int(self.short)}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.held_checks = int(state.get("held_checks", 0))
        self.short = bool(state.get("short", False))
