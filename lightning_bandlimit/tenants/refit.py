"""The refit: an arrival's top rung, taken before anything of it was measured, given back once
to what a run of its model on the device measured to fit (:func:`refit`).

A newcomer runs its first step on its top rung (the most it can save while unmeasured). At its
first check in the hold band it goes down to the fastest exact point that keeps ``min_free``
free, judged by its own measures and by a twin's: a peer whose stages free what this job's do
(:data:`TWIN_TOLERANCE`) is taken for a run of the same model, and its measured peak per rung
tells what a rung this job has not run needs. From a split (on the top rung) the points below
are the rungs (whole batch), then the smaller splits, as the ladder orders them.
"""

from __future__ import annotations

from collections.abc import Sequence

from lightning_bandlimit.ladder.controller import LadderController
from lightning_bandlimit.ladder.reasons import HOLD, LOWER
from lightning_bandlimit.ladder.setting import Decision, Setting
from lightning_bandlimit.tenants.ledger import Tenant
from lightning_bandlimit.tenants.order import changed_within

__all__ = ["TWIN_TOLERANCE", "refit"]

# ratio: a peer is a twin (a run of the same model) when, stage by stage, the least and the most
# its stage may free meet this job's within it. A plain step measures one figure and samples a
# range as wide as the stage's inputs; a torchvision resnet18 measured both ways (a user trial)
# had ranges that meet, where by the least alone its stage 1 differed by 10.3 %
TWIN_TOLERANCE = 1.1


def refit(
    decision: Decision,
    current: Setting,
    peers: Sequence[Tenant],
    at: float,
    controller: LadderController,
    dwell: float = 0.0,
) -> tuple[Decision, str | None]:
    """A hold on an exact point taken before the job was measured (an arrival's top rung, or a
    split on it) goes down to the fastest exact point below it that keeps ``min_free`` free
    (with the ladder's margin, on both, and its peak's noise; a point that needs more memory
    also keeps the margin of the hold band, ``release_free - min_free``, as slack), the decision
    carrying that point's split. What a point needs over the job's measured peak at ``current``:
    its own measure there; else, for a rung, by what a run of the same model measured: a peer
    whose stages free the same (the ranges :attr:`Tenant.stage_least` to ``stage_most`` of each
    stage meet, within :data:`TWIN_TOLERANCE`) and that measured both rungs adds its difference
    (the largest such difference; a peer publishes its whole batch's peaks only, so from a split
    there is none); where no such peer measured the job's point, the peer's peak on the rung
    against the job's own (the room for the arrival was sized on that peer's peak: runs of one
    model need the same). A rung the peer measured idle, and those above it, count at the memory
    of the rung below them (the ladder's own rule). A smaller split counts by the job's own
    measure only. ``decision`` unchanged (and ``None``) under pressure or above the hold band,
    while a peer arrives or changed within ``dwell`` of ``at`` (the time of the check), or when
    no point is known to fit.

    Example:
        >>> from lightning_bandlimit.memory.protocol import MemoryReading
        >>> ladder = LadderController(rungs=2, min_free=100, margin=0.0)
        >>> ladder.on_stages_measured([300.0, 100.0]); ladder.observe(Setting(2, 0.0), 1000)
        >>> calm = ladder.decide(MemoryReading(total=5000, free=150, source="scripted"), Setting(2, 0.0))
        >>> peaks = ((0, 1300), (1, 1040), (2, 1000))  # a run of the same model
        >>> twin = Tenant("a", 1, 0.0, rung_peaks=peaks, stage_least=(300, 100), stage_most=(300, 100))
        >>> refit(calm, Setting(2, 0.0), [twin], 1.0, ladder)[0].setting  # rung 1: +40
        Setting(rung=1, compression=0.0)
    """
    low = controller.min_free_bytes
    own = controller.measured(current)  # its peak there (a rung, or a split on the top rung)
    if (
        decision.reason != HOLD
        or low is None
        or decision.threshold != low  # above the hold band: the release takes it
        or current.compression > controller.min_compression
        or own is None
        or any(p.arriving for p in peers)
        or changed_within(peers, at, dwell) is not None
    ):
        return decision, None
    spare = controller.spare(decision.free)
    # a move nobody asked for lands a job at the bottom of the hold band, where the ladder's
    # own release never does (it goes down from above release_free): peaks creep over a run
    # (a MiB or two on the quickstart CPU job, whose band is 62), and a job landed at the edge
    # climbs back at once; so a point that adds memory keeps the margin of the band as slack
    slack = controller.margin * max(0, (controller.release_free_bytes or low) - low)
    twins = [_twin_peaks(p, controller.rungs) for p in peers if _same_stages(p, controller)]
    for point in _points_below(current, controller):  # the fastest first
        added = _added(point, current, own, twins, controller)
        need = max(added, default=0) * (1 + controller.margin)  # a measure has its noise too
        if added and need + (slack if need > 0 else 0) <= spare:
            where = f"rung {point.rung}" + (f" in {point.split} chunks" if point.split > 1 else "")
            why = f"the top rung taken on arrival is more than needed: {where} fits, a twin measured"
            return Decision.at(point, LOWER, decision.free, low), why
    return decision, None


def _points_below(current: Setting, controller: LadderController) -> list[Setting]:
    """The exact points below ``current`` (at its compression), the fastest first: the rungs
    below it, and from a split on the top rung the top rung's whole batch and smaller splits
    too (the ladder's order: rungs, then splits)."""
    points = controller.exact_points()
    if current.split > 1 and current in points:
        return points[: points.index(current)]
    return [Setting(rung, current.compression) for rung in range(current.rung)]


def _added(
    point: Setting, current: Setting, own: float, twins: list[dict[int, int]], controller: LadderController
) -> list[float]:
    """What going down from ``current`` (its peak ``own``) to ``point`` adds, by each measure
    that tells (none: not known): the job's own, else each twin's (:func:`refit`)."""
    if (at := controller.measured(point)) is not None:
        return [at - own]
    if point.split > 1:
        return []  # a peer publishes its whole batch's peaks only
    rung, mine = point.rung, current.rung
    added = [t[rung] - t[mine] for t in twins if rung in t and mine in t] if current.split == 1 else []
    return added or [t[rung] - own for t in twins if rung in t]


def _twin_peaks(peer: Tenant, rungs: int) -> dict[int, int]:
    """A twin's measured peak per rung, and on the rungs from its idle one up (measured to free
    next to nothing over the rung below, :attr:`Tenant.idle_from`) the rung below's: the
    ladder's own rule for a rung above its top (the same memory, faster)."""
    peaks = dict(peer.rung_peaks)
    idle = peer.idle_from
    if idle is not None and idle - 1 in peaks:
        for rung in range(idle, rungs + 1):
            peaks.setdefault(rung, peaks[idle - 1])
    return peaks


def _same_stages(peer: Tenant, controller: LadderController) -> bool:
    """Whether a peer's stages free what this job's do: for each stage, the ranges from the
    least to the most it may free meet (within :data:`TWIN_TOLERANCE`). Runs of one model, one
    measured in a plain step and one on samples, do; another model's stages do not."""
    least, most = controller.stage_least, controller.stage_savings
    if not least or not most or not (len(peer.stage_least) == len(peer.stage_most) == len(least)):
        return False
    ranges = zip(peer.stage_least, peer.stage_most, least, most)
    return all(max(a, c) <= TWIN_TOLERANCE * min(b, d) for a, b, c, d in ranges)
