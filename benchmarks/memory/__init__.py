"""Memory benchmarks: bytes kept for backward per rung and per compression, and what each exact byte costs."""
