"""What :class:`~lightning_bandlimit.callbacks.AdaptiveBandLimit` keeps in a checkpoint, as plain
values (:func:`ladder_state`, beside :class:`~lightning_bandlimit.callbacks.BandLimit`'s
compression), and how a resumed job reads it back (:func:`restore_ladder`).

A checkpoint holds the setting (compression, rung, split), the stages the rungs checkpoint (the
plan, :attr:`~lightning_bandlimit.callbacks.ladder_stages.ExactRungs.plan`: still known once the
fit's end released the units, so a checkpoint saved after ``fit`` returns holds what one saved
during the fit holds), the micro-batch trial's outcome
(:meth:`~lightning_bandlimit.callbacks.ladder_splits.SplitLever.state_dict`) and what the
controller learned (memory and times). A resumed job drops what a lever it no longer has saved
(without the checkpoint lever: rung 0 and no stages), keeps the trial's outcome (no second trial)
and reconciles the restored split with it, and holds the restored rung until the saved stages
are applied at the start of training
(:meth:`~lightning_bandlimit.callbacks.ladder_stages.ExactRungs.restore`). The setting restored is
returned, not applied: the callback moves there through its one move.
"""

from __future__ import annotations

from typing import Any

from lightning_bandlimit.callbacks.ladder_events import LadderEvents
from lightning_bandlimit.callbacks.ladder_splits import SplitLever
from lightning_bandlimit.callbacks.ladder_stages import ExactRungs
from lightning_bandlimit.ladder.controller import LadderController
from lightning_bandlimit.ladder.setting import Setting

__all__ = ["ladder_state", "restore_ladder"]


def ladder_state(
    setting: Setting, rungs: ExactRungs, splits: SplitLever | None, controller: LadderController
) -> dict[str, Any]:
    """The ladder's part of the callback's checkpoint, as plain values: the rung and split of
    ``setting`` (its compression is :class:`~lightning_bandlimit.callbacks.BandLimit`'s part),
    the trial's outcome (``None`` without the micro-batch lever), the stages (the plan, ``None``
    when none is known) and the controller's state.

    Example:
        >>> state = ladder_state(Setting(2, 0.0, split=1), ExactRungs(None), None, LadderController())
        >>> state["rung"], state["split"], state["split_trial"], state["stages"]
        (2, 1, None, None)
    """
    return {
        "rung": setting.rung,
        "split": setting.split,
        "split_trial": None if splits is None else splits.state_dict(),
        "stages": rungs.plan,  # known after the fit released the units too
        "controller": controller.state_dict(),
    }


def restore_ladder(
    state: dict[str, Any],
    levers: tuple[str, ...],
    rungs: ExactRungs,
    splits: SplitLever | None,
    events: LadderEvents,
    compression: float,
) -> Setting:
    """Read back what :func:`ladder_state` (and ``BandLimit``) saved: the stages go to ``rungs``
    (applied at the start of training), the controller's state through ``events``, the trial's
    outcome to ``splits``; returns the setting to resume at (the caller moves there).

    A checkpoint of a run with ``levers`` lacking ``"checkpoint"`` resumes on rung 0 with no
    stages; a restored split the trial's outcome does not allow is clamped, said once
    (:meth:`~lightning_bandlimit.callbacks.ladder_splits.SplitLever.restore_split`); an older
    checkpoint without the outcome tries the split again; a missing compression keeps
    ``compression`` (the callback's own).

    Raises:
        TypeError, ValueError: for a trial's outcome or a split that is not one the callback saves.

    Example:
        >>> events = LadderEvents(LadderController())
        >>> saved = {"compression": 0.3, "rung": 2, "split": 1, "stages": [["a"], ["b"]], "controller": {}}
        >>> restore_ladder(saved, ("compression",), ExactRungs(None), None, events, 0.0)
        Setting(rung=0, compression=0.3)
    """
    controller = dict(state.get("controller", {}))
    if "checkpoint" not in levers:
        controller["rungs"], state = 0, {**state, "rung": 0, "stages": None}
    rungs.saved_stages = state.get("stages")
    events.restore(controller)
    split = 1
    if splits is not None:
        if (trial := state.get("split_trial")) is not None:  # an older checkpoint: tried again
            splits.load_state_dict(trial)
        split = splits.restore_split(int(state.get("split", 1)))  # said once if clamped
    rung = int(state.get("rung", 0))  # applied once the stages are known
    return Setting(rung, state.get("compression", compression), split=split)
