"""The heartbeat record: what a rank's watchdog stores under its rank, encoded and decoded.

A :class:`Beat` is a counter the rank's watchdog thread bumps at every heartbeat, the step its
training loop last reported and whether it finished fitting, stored as a few ASCII bytes
(``b"<beat> <step> <done>"``, ``-`` for no step yet) so that any store holds it and a peer reads
it with one ``get``. Decoding what a key holds checks it whole: anything else is a ``ValueError``
that says what was found and what was expected (the watchdog takes it as no news from that peer).

Plain Python (no torch).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from lightning_bandlimit.utils.validation import check_int

__all__ = ["Beat"]

_BEAT = re.compile(r"([0-9]+) (-|-?[0-9]+) ([01])")


@dataclass(frozen=True)
class Beat:
    """One heartbeat of a rank, as stored: ``b"<beat> <step> <done>"`` (``-``: no step yet).

    Attributes:
        beat: a counter the rank's watchdog thread increments at every heartbeat (>= 0).
        step: the rank's global step as its training loop last reported it; ``None`` before that.
        done: whether the rank finished fitting (it stops beating then, and is never hung).

    Raises:
        TypeError: if ``beat`` or ``step`` is not an int, or ``done`` not a bool.
        ValueError: if ``beat`` is negative.

    Example:
        >>> Beat(beat=12, step=340).encode()
        b'12 340 0'
        >>> Beat.decode(b"13 - 1")
        Beat(beat=13, step=None, done=True)
    """

    beat: int
    step: int | None = None
    done: bool = False

    def __post_init__(self) -> None:
        check_int("beat", self.beat, minimum=0)
        if self.step is not None:
            check_int("step", self.step)
        if not isinstance(self.done, bool):
            raise TypeError(f"done must be a bool, got {self.done!r} ({type(self.done).__name__})")

    def encode(self) -> bytes:
        """The bytes stored for this beat (ASCII, a few bytes)."""
        return f"{self.beat} {'-' if self.step is None else self.step} {int(self.done)}".encode("ascii")

    @classmethod
    def decode(cls, data: bytes | str) -> Beat:
        """The beat ``data`` holds (what :meth:`encode` wrote; a str is accepted too).

        Raises:
            ValueError: if ``data`` is not a heartbeat.
        """
        try:
            text = data.decode("ascii") if isinstance(data, (bytes, bytearray)) else data
            found = _BEAT.fullmatch(text) if isinstance(text, str) else None
        except UnicodeDecodeError:
            found = None
        if found is None:
            shown = repr(data) if len(repr(data)) <= 60 else repr(data)[:57] + "..."
            raise ValueError(
                f"not a heartbeat: {shown} (expected b'<beat> <step or -> <done 0|1>', such as b'12 340 0')"
            )
        beat, step, done = found.groups()
        return cls(int(beat), None if step == "-" else int(step), done == "1")
