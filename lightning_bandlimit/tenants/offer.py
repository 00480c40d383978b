"""What a job publishes of itself for its peers to weigh (:func:`offer`): its setting (rung,
split and compression), the peaks its ladder measured, its model's fingerprint, and its next
move up: its kind, its predicted saving and its measured cost. Those are the fields of its
ledger entry (:class:`~lightning_bandlimit.tenants.ledger.Tenant`) that its ladder knows."""

from __future__ import annotations

from lightning_bandlimit.ladder.controller import LadderController
from lightning_bandlimit.ladder.setting import Setting
from lightning_bandlimit.utils.units import GIB

__all__ = ["offer", "top_memory"]


def offer(controller: LadderController, current: Setting) -> dict[str, object]:
    """What a job publishes of itself at ``current``: its setting (``rung``, ``split``,
    ``compression``), its measured peak there, whether it holds a lossy lever, whether an exact
    point is left above it (a rung, or a split on the top rung), and its next move's kind,
    predicted saving and measured cost (:class:`~lightning_bandlimit.tenants.ledger.Tenant`'s
    fields).

    Example:
        >>> ladder = LadderController(rungs=2, min_free=100)
        >>> ladder.on_stages_measured([300.0, 100.0]); ladder.observe(Setting(0, 0.0), 1000)
        >>> offer(ladder, Setting(0, 0.0))["next_freed"]  # rung 1 not visited: its stage's hint
        300.0
        >>> offer(ladder, Setting(2, 0.0, split=2))["split"]
        2
    """
    exact = current.compression <= controller.min_compression
    ladder = controller.exact_points()  # rungs, then splits on the top rung
    left = ladder[ladder.index(current) + 1 :] if current in ladder else []
    entry: dict[str, object] = {
        "rung": current.rung,
        "split": current.split,
        "compression": current.compression,
        "lossy": not exact,
        "exact_left": exact and bool(left),
        "next_freed": None,
        "next_lossy": None,
        "next_cost": None,
    }
    peak_now = controller.predict(current)
    entry["memory"] = None if peak_now is None else int(peak_now)  # its measured peak there
    points = controller.rung_memory.points
    top = top_memory(controller)
    entry["top_memory"] = None if top is None else int(top)
    entry["rung_peaks"] = tuple((int(r), int(b)) for r, b in sorted(points.items()))
    entry["stage_least"] = tuple(int(s) for s in controller.stage_least or ())
    entry["stage_most"] = tuple(int(s) for s in controller.stage_savings or ())
    entry["idle_from"] = controller.idle_from()
    if entry["exact_left"]:
        upper = left[0]  # the next rung, or the next split (its saving hinted until measured)
        freed = None
        if peak_now is not None and (after := controller.hinted(upper, peak_now)) is not None:
            freed = peak_now - after if upper.split > 1 or upper.rung in points else None
        if freed is None and upper.split == 1 and controller.stage_savings is not None:
            freed = controller.stage_savings[current.rung]
        slower = controller.slowdown(upper.rung, upper.split)
        base = controller.slowdown(current.rung, current.split) if current != ladder[0] else 1.0
        cost = None
        if freed is not None and freed > 0 and slower is not None and base is not None:
            cost = max(0.0, slower - base) / (freed / GIB)
        entry.update(next_freed=freed, next_lossy=False, next_cost=cost)
    elif controller.lossy and current.compression < controller.max_compression:
        target = controller.clamp(current.compression + controller.raise_step)
        after = controller.predict(Setting(controller.lossy_rung, target, split=controller.lossy_split))
        freed = None if peak_now is None or after is None else max(0.0, peak_now - after)
        entry.update(next_freed=freed, next_lossy=True)
    return entry


def top_memory(controller: LadderController) -> float | None:
    """The job's measured peak on its top rung (``None``: not measured there, or no rungs)."""
    return controller.rung_memory.points.get(controller.top) if controller.top else None
