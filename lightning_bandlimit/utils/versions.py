"""The versions of the libraries that determine a result, recorded beside it."""

from __future__ import annotations

import platform
from collections.abc import Iterable
from importlib import metadata

__all__ = ["library_versions"]

_DEFAULT = ("torch", "torchattacks", "lightning", "torchmetrics", "lightning-bandlimit")


def library_versions(distributions: Iterable[str] = _DEFAULT) -> dict[str, str]:
    """Python's version and each installed distribution's version ("not installed" if absent).

    Args:
        distributions: distribution names as pip knows them; keys use ``_`` for ``-``.

    Example:
        >>> sorted(library_versions())
        ['lightning', 'lightning_bandlimit', 'python', 'torch', 'torchattacks', 'torchmetrics']
        >>> library_versions(["no-such-distribution"])["no_such_distribution"]
        'not installed'
    """
    versions = {"python": platform.python_version()}
    for distribution in distributions:
        try:
            versions[distribution.replace("-", "_")] = metadata.version(distribution)
        except metadata.PackageNotFoundError:
            versions[distribution.replace("-", "_")] = "not installed"
    return versions
