"""The Redis engine: ``redis://[user:password@]host:port/db``, ``rediss://`` (TLS), and
``redis+cluster://host:port`` / ``rediss+cluster://`` for a Redis Cluster."""

from .backend import RedisBackend

__all__ = ["RedisBackend"]
