"""Locks as files in a directory: see ``backend``."""

from .backend import FileBackend

__all__ = ["FileBackend"]
