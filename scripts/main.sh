#!/usr/bin/env bash
# README command 1: the main job (band-limited vs full-spectrum training). Extra arguments go to it.
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
exec python -m lightning_bandlimit.jobs.main_job "$@"
