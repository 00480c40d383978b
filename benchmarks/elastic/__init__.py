"""The elastic benchmark: accuracy of a resized run against the fixed run, per scaling rule, seed-paired."""
