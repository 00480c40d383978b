"""Elastic training building blocks (the ElasticDDPStrategy itself is not written yet)."""
