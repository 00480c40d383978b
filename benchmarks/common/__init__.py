"""What the benchmarks share: result provenance (command, commit, versions), allocator, statistics."""
