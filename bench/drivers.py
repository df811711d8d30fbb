"""Bare driver connections for the peers and floors that bypass SQLAlchemy."""

from __future__ import annotations

from typing import Any

from sqlalchemy.engine import URL


def mysql_connection(url: URL) -> Any:
    """An autocommit pymysql connection to the server of a ``mysql+pymysql://`` URL."""
    import pymysql

    return pymysql.connect(
        host=url.host or "localhost",
        port=url.port or 3306,
        user=url.username,
        password=url.password or "",
        database=url.database,
        autocommit=True,
    )


def postgresql_connection(url: URL) -> Any:
    """An autocommit psycopg connection to the server of a ``postgresql+psycopg://`` URL."""
    import psycopg

    return psycopg.connect(
        host=url.host,
        port=url.port,
        user=url.username,
        password=url.password,
        dbname=url.database,
        autocommit=True,
    )
