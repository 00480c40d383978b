"""``python -m lightning_bandlimit.jobs.multitenant SPEC.json``: one job of the multi-tenant scenario."""

import sys

from lightning_bandlimit.jobs.multitenant.command import main

if __name__ == "__main__":
    main(sys.argv[1:])
