"""The ladder: which memory lever a job moves, and when (plain Python: no torch, no Lightning).

* :mod:`.setting`: a point of the ladder (:class:`Setting`), a :class:`Decision`, the reading
  decided from.
* :mod:`.reasons`: why a decision was taken, and its logged code.
* :mod:`.memory_model`: peak memory against a lever's setting (a rung, a compression), learned
  online.
* :mod:`.splits`: what the ladder measured of the micro-batch splits on the top rung.
* :mod:`.exact`: the exact points over (rung, split), what was measured on them, and the
  predictions, hints and bounds made from it.
* :mod:`.learned`: :class:`LadderModel`, the exact points with the compression continuum: the
  observations, the baseline, and the one rule that forgets what a change moved.
* :mod:`.growth`: others' memory growth between checks, and the trend expected of it.
* :mod:`.moves`: where a move goes (up under pressure or after an out-of-memory error, down on a
  release, room for a newcomer; one escalation path).
* :mod:`.controller`: :class:`LadderController`, the decisions (pressure, hold, release, an
  out-of-memory retry) over rungs, splits and compression; with ``rungs=0`` the
  compression-only ladder.

Example:
    >>> from lightning_bandlimit.memory import ScriptedProbe
    >>> ladder = LadderController(rungs=1, min_free=100)
    >>> ladder.decide(ScriptedProbe([50], total=1000).read(), Setting(0, 0.0)).setting
    Setting(rung=1, compression=0.0)
"""

from lightning_bandlimit.ladder.controller import LadderController
from lightning_bandlimit.ladder.learned import LadderModel
from lightning_bandlimit.ladder.memory_model import MemoryModel, threshold_bytes
from lightning_bandlimit.ladder.reasons import HOLD, LOWER, OOM, RAISE, REASON_CODES
from lightning_bandlimit.ladder.setting import Decision, FreeMemory, Setting

__all__ = [
    "HOLD",
    "LOWER",
    "OOM",
    "RAISE",
    "REASON_CODES",
    "Decision",
    "FreeMemory",
    "LadderController",
    "LadderModel",
    "MemoryModel",
    "Setting",
    "threshold_bytes",
]
