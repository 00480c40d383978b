"""``python -m lightning_bandlimit``: the ``lightning-bandlimit`` command line."""

from lightning_bandlimit.jobs.cli import main

if __name__ == "__main__":
    main()
