"""A bank on the database that the environment names, as tests/test_django.py runs it.

``BANK_DB_URL``: a SQLAlchemy URL of a MariaDB or PostgreSQL server, or ``sqlite://``
for files in ``BANK_DIR``; ``BANK_TEST_NAME``: the test database's name on a server;
``BANK_DB_NAME``: run on that database instead (a second process on the test database);
``BANK_TIERLOCK``: a JSON object of further ``TIERLOCK`` settings (``TABLE``, ``URL``...).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from sqlalchemy.engine import make_url

SECRET_KEY = "tierlock test project"
DEBUG = False
ALLOWED_HOSTS = ["testserver"]
INSTALLED_APPS = ["tierlock.contrib.django", "bank"]
MIDDLEWARE: list[str] = []
ROOT_URLCONF = "bankproject.urls"
USE_TZ = True
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"


def database() -> dict[str, Any]:
    url = make_url(os.environ.get("BANK_DB_URL", "sqlite://"))
    backend = url.get_backend_name()
    if backend == "sqlite":
        directory = Path(os.environ["BANK_DIR"])
        return {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": str(directory / "bank.sqlite3"),
            # Writers take turns from BEGIN on: a deferred transaction that read first
            # could not write once another had committed.
            "OPTIONS": {"transaction_mode": "IMMEDIATE", "timeout": 30},
            # A file, so that a second process can share it.
            "TEST": {"NAME": str(directory / "test_bank.sqlite3")},
        }
    if backend in ("mysql", "mariadb"):
        import pymysql

        pymysql.install_as_MySQLdb()
    return {
        "ENGINE": "django.db.backends.postgresql"
        if backend == "postgresql"
        else "django.db.backends.mysql",
        "NAME": url.database,
        "USER": url.username or "",
        "PASSWORD": url.password or "",
        "HOST": url.host or "",
        "PORT": url.port or "",
        "TEST": {"NAME": os.environ.get("BANK_TEST_NAME")},
    }


# ATOMIC_REQUESTS: every view runs in a transaction, as the transaction rule expects.
DATABASES = {"default": {**database(), "ATOMIC_REQUESTS": True}}
if "BANK_DB_NAME" in os.environ:
    DATABASES["default"]["NAME"] = os.environ["BANK_DB_NAME"]

# No reaper in the project's processes: the tests reap with `manage.py tierlock reap`,
# which a reaper's tick in the test process would race (it reaped the expired row
# first, once a suite ran past its first minute, and the command found nothing).
TIERLOCK: dict[str, Any] = {"TTL": 10, "REAPER_INTERVAL": None}
TIERLOCK.update(json.loads(os.environ.get("BANK_TIERLOCK", "{}")))
