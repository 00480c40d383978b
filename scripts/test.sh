#!/usr/bin/env bash
# README command 2: the whole test suite (unit tests and doctests). Extra arguments go to pytest.
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
exec python -m pytest "$@"
