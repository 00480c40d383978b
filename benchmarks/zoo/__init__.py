"""The model-zoo matrix: every zoo model through every lever (the cells of ``tests/zoo``), as one table."""
