"""The benchmarks behind the README's figures, one room per thing measured (``benchmarks/README.md``).

Run a script from the repository root as a module, e.g. ``python -m benchmarks.memory.model_memory``;
what the rooms share (result provenance, paired statistics) is in :mod:`benchmarks.common`.
"""
