"""Benchmarks of tierlock against its peers and its floor; run them with ``python -m bench``."""
