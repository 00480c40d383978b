"""Hangs: the rule deciding, from the peers' heartbeats read at each round, who is hung.

Plain Python (no torch, no threads): a :class:`HangJudge` on every rank is given the time and
the peers' :class:`~lightning_bandlimit.health.beat.Beat` read at that time (the watchdog of
:mod:`~lightning_bandlimit.health.heartbeat` reads them from the run's store) and returns a
:class:`Hang`, with its reason, or ``None``.

**The rule.** Per peer the judge remembers the last beat seen and when it last changed; a peer
never seen counts from the first reading. A peer not ``done`` whose beat has not changed for
``hang_timeout`` or more is hung: the longest silent one is returned (ties: the lowest rank),
named with its last step (``"rank 1 has not advanced past step 12"``), or as having stopped
before its first step, or as having sent no heartbeat at all. The judge's own rank is ignored. A
missing beat is no news: it neither changes nor ends a silence. A ``done`` peer stopped beating on
purpose and is never hung, until it beats again (a new fit).

**A store that does not answer.** A reading that fails (or has not come back) is reported with
:meth:`HangJudge.unreachable`; once that has been so continuously for ``hang_timeout`` it is a
:class:`Hang` with ``rank=None``. Time the store spent not answering is not counted against the
peers: their silence resumes where it was at the next reading.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from lightning_bandlimit.health.beat import Beat
from lightning_bandlimit.utils.validation import check_int, check_real

__all__ = ["Hang", "HangJudge"]


def _seconds(value: float) -> str:
    return f"{value:.1f}" if value >= 0.1 or value == 0 else f"{value:.2g}"


@dataclass(frozen=True)
class Hang:
    """A hung peer (``rank``), or the run's store not answering (``rank=None``).

    Attributes:
        rank: the hung peer's rank; ``None`` for the store.
        step: the peer's last reported step (``None``: none seen, or the store).
        seconds: how long its beat had not changed (the store had not answered).
        hang_timeout: the judge's ``hang_timeout``.
        reason: what was seen, the subject of :meth:`message` (``"rank 1 has not advanced past step 12"``).
        seen_by: the rank that judged it (``None``: unknown).

    Example:
        >>> hang = Hang(1, 12, 61.0, 60.0, "rank 1 has not advanced past step 12", seen_by=0)
        >>> hang.message()  # doctest: +ELLIPSIS
        'rank 1 has not advanced past step 12 for 61.0 s (hang_timeout=60.0 s): exiting so the agent ...'
    """

    rank: int | None
    step: int | None
    seconds: float
    hang_timeout: float
    reason: str
    seen_by: int | None = None

    def message(self) -> str:
        """One line: what was seen, for how long, and what happens next."""
        return (
            f"{self.reason} for {_seconds(self.seconds)} s (hang_timeout={_seconds(self.hang_timeout)} s): "
            "exiting so the agent restarts the group from the last checkpoint"
        )


class HangJudge:
    """Judges, from the beats read at each round, whether a peer (or the store) hangs.

    Per peer it remembers the last :class:`~lightning_bandlimit.health.beat.Beat` seen and when
    (by ``now``) it last changed; a peer never seen counts from the first :meth:`observe`. A peer
    not ``done`` whose beat has not changed for ``hang_timeout`` or more is hung (the longest
    silent; ties: the lowest rank). Its own rank is ignored. A ``None`` or missing beat is no
    news: it neither changes nor ends a silence. Time the store spent not answering (from the first
    :meth:`unreachable` to the next :meth:`observe`) is not counted against the peers.

    Args:
        rank: this rank.
        world_size: the number of ranks (>= 1).
        hang_timeout: seconds without a change after which a peer is hung (> 0, finite).

    Raises:
        TypeError: if an argument has the wrong type.
        ValueError: if ``world_size < 1``, ``rank`` not in ``[0, world_size - 1]`` or ``hang_timeout <= 0``.

    Example:
        >>> judge = HangJudge(rank=0, world_size=2, hang_timeout=60.0)
        >>> judge.observe(0.0, {1: Beat(1, step=12)}), judge.observe(59.0, {1: Beat(1, step=12)})
        (None, None)
        >>> judge.observe(61.0, {1: Beat(1, step=12)}).message()  # doctest: +ELLIPSIS
        'rank 1 has not advanced past step 12 for 61.0 s (hang_timeout=60.0 s): exiting ...'
    """

    def __init__(self, rank: int, world_size: int, hang_timeout: float) -> None:
        self.world_size = check_int("world_size", world_size, minimum=1)
        self.rank = check_int("rank", rank, minimum=0, maximum=world_size - 1)
        self.hang_timeout = check_real("hang_timeout", hang_timeout, minimum=0.0, min_open=True)
        self._peers = tuple(r for r in range(world_size) if r != rank)
        self._last: dict[int, Beat | None] = {}
        self._changed: dict[int, float] = {}
        self._unreachable_since: float | None = None

    def observe(self, now: float, beats: Mapping[int, Beat | None]) -> Hang | None:
        """The peers' beats read at ``now``: the longest silent hung peer, or ``None``.

        Args:
            now: the time of the reading in seconds (the same clock at every call).
            beats: each peer's beat by rank (``None`` or absent: not published yet); others ignored.
        """
        if self._unreachable_since is not None:  # the store's silence is no peer's
            paused = max(0.0, now - self._unreachable_since)
            self._changed = {peer: min(now, t + paused) for peer, t in self._changed.items()}
            self._unreachable_since = None
        worst: tuple[float, int] | None = None
        for peer in self._peers:
            beat = beats.get(peer)
            if peer not in self._changed or (beat is not None and beat != self._last[peer]):
                self._last[peer], self._changed[peer] = beat, now
            last, silent = self._last[peer], now - self._changed[peer]
            if (last is None or not last.done) and silent >= self.hang_timeout:
                worst = (silent, peer) if worst is None or silent > worst[0] else worst
        if worst is None:
            return None
        silent, peer = worst
        last = self._last[peer]
        if last is None:
            reason = f"rank {peer} has sent no heartbeat"
        elif last.step is None:
            reason = f"rank {peer} has stopped beating before its first step"
        else:
            reason = f"rank {peer} has not advanced past step {last.step}"
        return Hang(peer, None if last is None else last.step, silent, self.hang_timeout, reason, self.rank)

    def unreachable(self, now: float, error: str, since: float | None = None) -> Hang | None:
        """The store failed (or has not answered) at ``now``: a :class:`Hang` with ``rank=None``
        once it has been so continuously for ``hang_timeout``; a successful :meth:`observe` resets it.

        Args:
            now: the time of the failure.
            error: what failed, for the message (on one line, its first 200 characters).
            since: when the failed request began (one may block before it fails); ``now`` if ``None``.
        """
        start = now if since is None else min(since, now)
        if self._unreachable_since is None or start < self._unreachable_since:
            self._unreachable_since = start
        silent = now - self._unreachable_since
        if silent < self.hang_timeout:
            return None
        error = " ".join(str(error).split())  # on one line, its first 200 characters
        error = error if len(error) <= 200 else error[:197] + "..."
        reason = (
            "the run's store (in rank 0's process under Lightning's own launcher, so rank 0 may be "
            f"stopped; in torchrun's agent under torchrun) has not answered ({error})"
        )
        return Hang(None, None, silent, self.hang_timeout, reason, self.rank)
