"""Fault benchmarks: the chaos soak of a torchrun elastic job, and the clean-exit rate of the command line."""
