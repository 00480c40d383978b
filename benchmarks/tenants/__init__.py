"""Tenant benchmarks: jobs sharing one memory budget with a co-tenant or with each other (CPU and GPU)."""
