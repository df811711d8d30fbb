"""``manage.py tierlock ls [--json] | release KEY --force | reap``: the ``tierlock``
command's admin commands on the lock table of ``settings.TIERLOCK``, with the same
output (``tierlock.tools.admin``) and exit codes: 0 success; 1 the settings, the driver,
the database or the table failed (``CommandError: <why>``, one line on stderr); 2 bad
usage, ``release`` without ``--force`` included."""

from __future__ import annotations

import json
import logging
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import BaseCommand, CommandError
from rich.console import Console

from tierlock import BackendError, LockError, LockManager
from tierlock.contrib.django.conf import resolve
from tierlock.contrib.django.schema import open_manager
from tierlock.tools import admin
from tierlock.urls import shown_url


class Command(BaseCommand):  # type: ignore[misc]
    help = "List, force-release or reap the locks in tierlock's lock table."

    def add_arguments(self, parser: Any) -> None:
        commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
        listing = commands.add_parser("ls", help="every row: who holds what, for how long")
        listing.add_argument("--json", action="store_true", help="one JSON array of rows")
        release = commands.add_parser("release", help="delete KEY's row, whoever holds it")
        release.add_argument("key", metavar="KEY")
        release.add_argument("--force", action="store_true", help="really delete it")
        commands.add_parser("reap", help="delete the rows whose lease has ended")

    def handle(self, *args: Any, command: str, **options: Any) -> None:
        if command == "release" and not options["force"]:
            raise CommandError(admin.FORCE_NEEDED.format(key=options["key"]), returncode=2)
        # The command says what it did; without a handler anywhere, the library's
        # warnings (a force-release, a reap) would reach stderr through logging's last
        # resort. A handler the project configured still gets them.
        library_logger = logging.getLogger("tierlock")
        if not library_logger.handlers:
            library_logger.addHandler(logging.NullHandler())
        try:
            target = resolve()
            where = shown_url(target.url)
            # For admin work: no reaper, and the table is never created here.
            with open_manager(target, create_table=False, reaper_interval=None) as locks:
                self._run(locks, command, options, where)
        except BackendError as exc:  # (raised by the manager only: ``where`` is known)
            raise CommandError(f"{where}: {exc}") from exc
        except (LockError, ImproperlyConfigured, ValueError, TypeError) as exc:
            # A missing table or driver, a bad setting or URL: the message says which.
            raise CommandError(str(exc)) from exc

    def _run(self, locks: LockManager, command: str, options: dict[str, Any], where: str) -> None:
        if command == "ls":
            holders = locks.holders()
            if options["json"]:
                records = [admin.holder_record(info) for info in holders]
                self.stdout.write(json.dumps(records, indent=2))
            else:
                admin.show_holders(holders, table=locks.table, where=where, out=self.stdout)
        elif command == "release":
            self._print(admin.released(options["key"], locks.force_release(options["key"])))
        else:
            self._print(admin.reaped(locks.reap(), locks.table))

    def _print(self, renderable: Any) -> None:
        """Rendered for the real terminal (its width, its colours), as ``tierlock``
        does, and written through ``self.stdout`` so that ``call_command`` can catch it."""
        console = Console(soft_wrap=True, highlight=False)
        with console.capture() as capture:
            console.print(renderable)
        self.stdout.write(capture.get(), ending="")
