"""Accuracy benchmarks: BatchNorm after a compression switch; the robustness study of band-limited models."""
