"""The SQL engine (SQLAlchemy): SQLite, MariaDB/MySQL (pymysql), PostgreSQL (psycopg 3).

``backend`` holds keys as rows of ``table``'s lock table, and ``admin`` inspects,
force-releases and cleans it; ``running`` sends statements and sorts their failures;
``combining`` and ``batches`` let threads share statements; ``engine`` and ``schema``
make engines and tables ready;
``notify`` (PostgreSQL) and ``bells`` (MariaDB/MySQL) wake pollers; ``watchdog`` bounds
PostgreSQL's tries; ``sweeper`` deletes rows that no thread will use.
"""

from .backend import SQLBackend

__all__ = ["SQLBackend"]
