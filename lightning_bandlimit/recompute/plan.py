"""The exact rungs ordered by what their bytes cost: cheapest bytes first, about a shortfall each.

Each unit offers up to two *moves*: to its pointwise mode (keep its convolutions' outputs,
recompute the ops between them, :mod:`.pointwise`) and on to its full mode (recompute its whole
forward), or straight to the full mode where the pointwise one is not available. A move frees
bytes (measured on the first step: what the unit saved for backward, less its input, its
convolutions' outputs and its own output, which a neighbour keeps) and costs seconds (the
forward of what it recomputes, measured on the same step). :func:`plan_rungs` orders the moves
by bytes freed per second of recompute, a unit's pointwise move before its full one, and cuts
the order into at most ``max_rungs`` rungs of about equal bytes, and where the bytes get twice
as dear (the cheap pointwise moves are not paid at the price of the full ones that follow
them): rung ``r`` makes the first
``r`` rungs' moves. The top rung makes every move (every unit in full), as the stage rungs did:
the compression continuum runs there. Pure Python: no torch.

A move is named by its unit (the full mode) or by :func:`pointwise_move` of it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

__all__ = [
    "POINTWISE_PREFIX",
    "PlannedMove",
    "RungPlan",
    "UnitCost",
    "parse_move",
    "plan_rungs",
    "pointwise_move",
]

POINTWISE_PREFIX = "pointwise:"
_TINY = 1e-9  # seconds: a move measured at no cost still sorts by its bytes
_DEARER = 0.5  # a move whose bytes cost twice the rung's so far starts a rung of its own


def pointwise_move(unit: str) -> str:
    """The name of ``unit``'s move to its pointwise mode.

    Example:
        >>> pointwise_move("layer1.0"), parse_move(pointwise_move("layer1.0")), parse_move("layer1.0")
        ('pointwise:layer1.0', ('layer1.0', 'pointwise'), ('layer1.0', 'full'))
    """
    return POINTWISE_PREFIX + unit


def parse_move(move: str) -> tuple[str, str]:
    """``(unit, mode)`` of a move's name (``mode``: ``"pointwise"`` or ``"full"``)."""
    if move.startswith(POINTWISE_PREFIX):
        return move[len(POINTWISE_PREFIX) :], "pointwise"
    return move, "full"


@dataclass(frozen=True)
class UnitCost:
    """What one unit's moves free and cost.

    Attributes:
        full: bytes checkpointing the unit in full frees.
        full_least: the least it may free (``full`` when measured plainly).
        seconds: its forward time (the full mode's recompute).
        pointwise: bytes its pointwise mode frees (``None``: no pointwise move).
        pointwise_seconds: the forward time of what the pointwise mode recomputes.
    """

    full: float
    full_least: float
    seconds: float | None
    pointwise: float | None = None
    pointwise_seconds: float | None = None


class PlannedMove(NamedTuple):
    """A move in the order the plan takes it.

    Attributes:
        name: the move (its unit for the full mode, :func:`pointwise_move` of it for the pointwise one).
        freed: bytes it frees.
        seconds: what its recompute costs.
    """

    name: str
    freed: float
    seconds: float


class _Move(NamedTuple):
    """A move as the plan weighs it: a :class:`PlannedMove` with the least it may free."""

    name: str
    freed: float
    least: float
    seconds: float


@dataclass(frozen=True)
class RungPlan:
    """The rungs (moves per rung, cheapest bytes first) and what each frees.

    Attributes:
        rungs: the moves of each rung.
        savings: bytes each rung frees.
        least: the least each may free.
        order: every move in the order taken, with its bytes and seconds (:class:`PlannedMove`).
    """

    rungs: list[list[str]]
    savings: list[float]
    least: list[float]
    order: list[PlannedMove]


def plan_rungs(costs: Mapping[str, UnitCost], units: Sequence[str], max_rungs: int = 8) -> RungPlan:
    """The rungs over ``units`` by bytes freed per second of recompute.

    Args:
        costs: what each unit's moves free and cost.
        units: the units in their fallback order (highest resolution first): ties go in this
            order. When any unit's time is unknown, every unit counts one second (a pointwise
            move half its unit's), so the moves go by bytes.
        max_rungs: the most rungs (moves are grouped into rungs of about ``1 / max_rungs`` of
            the bytes); at least 1.

    Raises:
        ValueError: for ``max_rungs`` below 1 or a unit without costs.

    Example:
        >>> costs = {
        ...     "a": UnitCost(full=100, full_least=100, seconds=1.0, pointwise=40, pointwise_seconds=0.1),
        ...     "b": UnitCost(full=60, full_least=60, seconds=1.0),
        ... }
        >>> plan = plan_rungs(costs, ["a", "b"], max_rungs=3)
        >>> plan.rungs, plan.savings
        ([['pointwise:a'], ['a'], ['b']], [40.0, 60.0, 60.0])
    """
    if max_rungs < 1:
        raise ValueError(f"max_rungs must be at least 1, got {max_rungs}")
    missing = [u for u in units if u not in costs]
    if missing:
        raise ValueError(f"no costs for units {missing}")
    timed = all(costs[u].seconds is not None for u in units)
    rank = {u: i for i, u in enumerate(units)}
    pending: dict[str, list[_Move]] = {}
    for u in units:
        c = costs[u]
        seconds = c.seconds if timed and c.seconds is not None else 1.0
        moves = []
        if c.pointwise is not None and c.pointwise > 0:
            p_seconds = c.pointwise_seconds if timed and c.pointwise_seconds is not None else 0.5 * seconds
            p_seconds = min(max(p_seconds, _TINY), seconds)
            p_least = min(c.pointwise, c.full_least)
            moves.append(_Move(pointwise_move(u), c.pointwise, p_least, p_seconds))
            rest = max(0.0, c.full - c.pointwise)
            moves.append(_Move(u, rest, max(0.0, c.full_least - p_least), max(seconds - p_seconds, _TINY)))
        else:
            moves.append(_Move(u, max(0.0, c.full), max(0.0, c.full_least), max(seconds, _TINY)))
        pending[u] = moves

    def price(u: str) -> tuple[float, int]:
        """Bytes per second of ``u``'s next move, ties in ``units`` order."""
        move = pending[u][0]
        return move.freed / move.seconds, -rank[u]

    order: list[_Move] = []
    while any(pending.values()):
        unit = max((name for name, moves in pending.items() if moves), key=price)
        order.append(pending[unit].pop(0))
    total = sum(move.freed for move in order)
    target = total / max_rungs
    rungs: list[list[str]] = []
    savings: list[float] = []
    least: list[float] = []
    seconds = 0.0
    for move in order:
        # a new rung once this one frees its share, or where the bytes get much dearer
        dearer = rungs and move.freed * seconds < _DEARER * savings[-1] * move.seconds
        full = rungs and savings[-1] >= target
        if not rungs or (move.freed > 0 and len(rungs) < max_rungs and (full or dearer)):
            rungs.append([])
            savings.append(0.0)
            least.append(0.0)
            seconds = 0.0
        rungs[-1].append(move.name)
        savings[-1] += move.freed
        least[-1] += move.least
        seconds += move.seconds
    return RungPlan(rungs, savings, least, [PlannedMove(m.name, m.freed, m.seconds) for m in order])
