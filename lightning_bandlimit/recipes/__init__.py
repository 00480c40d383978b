"""Recipes built on the library: ``robustness`` (adversarial and frequency-band evaluation)."""
