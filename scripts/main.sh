#!/usr/bin/env bash
# README command 1: the main job (for now the band-limiting demo). Extra arguments go to it.
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
exec python -m lightning_bandlimit.demo "$@"
