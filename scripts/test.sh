#!/usr/bin/env bash
# README command 2: the whole test suite (unit tests and doctests), side by side on pytest-xdist
# workers (twice the cores, at most 8: most slow tests wait on processes they started). Extra
# arguments go to pytest and win: `-n 0` runs it serially, `tests/health` or `-k name` runs a part.
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
workers="${BANDLIMIT_TEST_WORKERS:-$(python -c 'import os; print(min(8, 2 * len(os.sched_getaffinity(0))))')}"
exec python -m pytest -n "$workers" --dist loadgroup "$@"
