"""Where ``locks`` keeps its locks, from the settings; no database is needed."""

from __future__ import annotations

from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.test import SimpleTestCase
from sqlalchemy.engine import make_url

from tierlock.contrib.django import conf
from tierlock.contrib.django.conf import database_url, resolve


class SettingsTests(SimpleTestCase):  # type: ignore[misc]
    def test_server_urls_quote_the_password(self) -> None:
        database = {"NAME": "bank", "USER": "app", "PASSWORD": "p@ss:w/rd?#", "HOST": "db"}
        mysql = make_url(database_url({**database, "PORT": "3307"}, "mysql"))
        assert (mysql.drivername, mysql.host, mysql.port) == ("mysql+pymysql", "db", 3307)
        assert (mysql.username, mysql.password, mysql.database) == ("app", "p@ss:w/rd?#", "bank")
        postgres = make_url(database_url(database, "postgresql"))
        assert (postgres.drivername, postgres.port) == ("postgresql+psycopg", None)
        assert postgres.password == "p@ss:w/rd?#"

    def test_a_socket_path_goes_to_the_query(self) -> None:
        database = {"NAME": "bank", "HOST": "/run/db"}
        assert make_url(database_url(database, "mysql")).query == {"unix_socket": "/run/db"}
        assert make_url(database_url(database, "postgresql")).query == {"host": "/run/db"}

    def test_sqlite_locks_live_beside_the_file(self) -> None:
        url = make_url(database_url({"NAME": "/srv/app/db.sqlite3"}, "sqlite"))
        assert url.database == "/srv/app/db-tierlock.sqlite3"
        memory = make_url(database_url({"NAME": "file:memorydb?mode=memory"}, "sqlite"))
        assert memory.database is not None
        assert Path(memory.database).parent.name.startswith("tierlock-django-")

    def test_a_url_to_the_applications_sqlite_file_is_refused(self) -> None:
        with pytest.raises(ImproperlyConfigured, match="application's own SQLite file"):
            conf._refuse_application_file("sqlite:////srv/db.sqlite3", {"NAME": "/srv/db.sqlite3"})
        conf._refuse_application_file("sqlite:////srv/locks.db", {"NAME": "/srv/db.sqlite3"})

    def test_other_databases_need_a_url(self) -> None:
        with pytest.raises(ImproperlyConfigured, match=r"not oracle; give TIERLOCK\['URL'\]"):
            database_url({"NAME": "x"}, "oracle")

    def test_bad_settings_are_named(self) -> None:
        with (
            self.settings(TIERLOCK={"TTL": 5, "TABEL": "x"}),
            pytest.raises(ImproperlyConfigured, match=r"unknown key\(s\) TABEL; known keys"),
        ):
            resolve()
        with (
            self.settings(TIERLOCK={"DATABASE": "nowhere"}),
            pytest.raises(ImproperlyConfigured, match="'nowhere', not in DATABASES"),
        ):
            resolve()

    def test_options_reach_the_manager(self) -> None:
        with self.settings(TIERLOCK={"TABLE": "t", "TTL": 5, "REAPER_INTERVAL": None}):
            target = resolve()
        assert target.table == "t"
        assert dict(target.options) == {"ttl": 5, "reaper_interval": None}
