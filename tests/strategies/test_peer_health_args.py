"""``ElasticDDPStrategy``'s peer-health arguments: checked in ``__init__``, with what was given."""

from __future__ import annotations

from typing import Any

import pytest

from lightning_bandlimit.strategies import ElasticDDPStrategy


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"hang_timeout": 0.0}, ValueError, "hang_timeout must be > 0"),
        ({"hang_timeout": -5}, ValueError, "got -5"),
        ({"hang_timeout": float("inf")}, ValueError, "hang_timeout"),
        ({"hang_timeout": "60"}, TypeError, "hang_timeout"),
        ({"slow_factor": 1.0}, ValueError, "slow_factor must be > 1"),
        ({"slow_steps": 0}, ValueError, "slow_steps"),
        ({"slow_steps": 2.5}, TypeError, "slow_steps"),
        ({"drop_stragglers": 1}, TypeError, "drop_stragglers must be a bool, got int"),
        ({"drop_stragglers": True, "slow_factor": None}, ValueError, "needs a slow_factor"),
    ],
)
def test_a_bad_argument_is_refused_with_what_was_given(
    kwargs: dict[str, Any], error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        ElasticDDPStrategy(**kwargs)


def test_defaults_watch_hangs_and_stragglers_and_none_turns_them_off() -> None:
    on = ElasticDDPStrategy()
    assert (on.hang_timeout, on.slow_factor, on.slow_steps, on.drop_stragglers) == (60.0, 2.0, 20, False)
    assert on._detector is not None
    off = ElasticDDPStrategy(hang_timeout=None, slow_factor=None)
    assert off.hang_timeout is None and off._detector is None
    off._start_health()  # nothing to start: no process group needed
    assert off._watchdog is None
