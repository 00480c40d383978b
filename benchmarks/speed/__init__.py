"""Speed benchmarks: step time of the layers, the models and the callbacks against their plain twins."""
