"""Benchmarks of tierlock against its floor; run them with ``python -m bench``."""
