"""Private, throw-away database servers that a test may stop and start at will.

The shared servers serve every test worker at once, so a test that restarts its
database gets one of its own: a fresh data directory under a temporary directory, a
free loopback port, its own socket. ``restart()`` is a real one (clean shutdown, then
the same data directory is served again); ``close()`` kills the server and removes
every file it wrote.

``Server`` is the base of every kind of private server: the SQL ones here, Redis
(``redis_servers``) and ZooKeeper (``zk_servers``).

::

    with private_server("postgresql") as server:
        engine = create_engine(server.url)
        ...
        server.restart()
"""

from __future__ import annotations

import abc
import contextlib
import glob
import os
import pwd
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import ClassVar, TypeVar

from sqlalchemy import create_engine, text
from sqlalchemy.pool import NullPool

__all__ = [
    "MariaDBServer",
    "PostgreSQLServer",
    "Server",
    "ServerUnavailable",
    "private_server",
    "program",
]

# Generous bounds: a loaded CI machine may take seconds to start or stop a server.
READY_TIMEOUT = 60.0
STOP_TIMEOUT = 30.0
POLL = 0.02


class ServerUnavailable(Exception):
    """The server's programs are missing or it did not start; the message says why."""


def free_port() -> int:
    """A free loopback port below the ephemeral range, so that no outgoing connection
    can take it while the server is down between a stop and the next start."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 0
    candidates = random.sample(range(20000, low), 50) if low > 21000 else []
    for port in [*candidates, 0]:
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
            bound: int = probe.getsockname()[1]
            return bound
    raise ServerUnavailable("no free loopback port")


def free_ports(count: int) -> list[int]:
    """``count`` distinct free loopback ports (see ``free_port``)."""
    ports: set[int] = set()
    while len(ports) < count:
        ports.add(free_port())
    return sorted(ports)


def _dying_with_parent(command: list[str]) -> list[str]:
    """``command`` made to be killed by the kernel if the test process dies without
    tearing it down, instead of running on (Linux's parent-death signal)."""
    setpriv = shutil.which("setpriv")
    return command if setpriv is None else [setpriv, "--pdeathsig", "SIGKILL", "--", *command]


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


_ServerT = TypeVar("_ServerT", bound="Server")


class Server(abc.ABC):
    """One private server: ``start()``, ``stop()``, ``restart()``, ``close()``."""

    name: ClassVar[str]
    # SIGTERM is a clean shutdown for MariaDB, Redis and ZooKeeper; PostgreSQL needs
    # SIGINT ("fast") to end sessions instead of waiting for every client to disconnect.
    stop_signal: ClassVar[signal.Signals] = signal.SIGTERM

    def __init__(self, root: Path | None = None) -> None:
        """``root``: the directory for the server's files, made if missing; by default
        a new temporary one. ``close()`` removes it if the server made it."""
        self.port = free_port()
        if root is None:
            root = Path(tempfile.mkdtemp(prefix=f"tierlock-{self.name}-"))
            root.chmod(0o755)
            self._made_root = True
        else:
            self._made_root = not root.exists()
            root.mkdir(parents=True, exist_ok=True)
        self.root = root
        self.data = root / "data"
        self.log = self.root / "server.log"
        self._process: subprocess.Popen[bytes] | None = None
        self.last_start_seconds = 0.0
        self.last_stop_seconds = 0.0

    @property
    @abc.abstractmethod
    def url(self) -> str:
        """The URL the tests give tierlock (for a SQL server, the SQLAlchemy URL of the
        test database)."""

    @property
    def _ready_url(self) -> str:
        """A SQLAlchemy URL that answers as soon as the server accepts connections
        (for the default ``_answers``)."""
        return self.url

    def _initialize(self) -> None:  # noqa: B027 (optional hook)
        """Prepare the data directory before the first start; by default nothing."""

    @abc.abstractmethod
    def _command(self) -> list[str]:
        """The server's command line."""

    def _run_as(self) -> str | None:
        """The OS user to run the server as, or None for the current one."""
        return None

    def _after_first_start(self) -> None:  # noqa: B027 (optional hook)
        """Create what the tests need, once; by default nothing."""

    def initialize_and_start(self) -> None:
        """Prepare the data directory and start the server for the first time; if that
        fails, ``close()`` it, leaving nothing behind."""
        try:
            self._initialize()
            self.start()
            self._after_first_start()
        except BaseException:
            self.close()
            raise

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def start(self) -> None:
        """Start the server on its data directory and wait until it takes connections."""
        if self.running:
            raise RuntimeError(f"{self.name} is already running")
        began = time.monotonic()
        user = self._run_as()
        with self.log.open("ab") as log:
            self._process = subprocess.Popen(
                _dying_with_parent(self._command()),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                user=user,
            )
        self._wait_ready(began + READY_TIMEOUT)
        self.last_start_seconds = time.monotonic() - began

    def _wait_ready(self, deadline: float) -> None:
        while True:
            assert self._process is not None
            if self._process.poll() is not None:
                raise ServerUnavailable(
                    f"{self.name} exited with {self._process.returncode} while starting:\n"
                    f"{_tail(self.log)}"
                )
            try:
                self._answers()
                return
            except Exception as exc:
                if time.monotonic() > deadline:
                    raise ServerUnavailable(
                        f"{self.name} not ready after {READY_TIMEOUT:g} s ({exc}):\n"
                        f"{_tail(self.log)}"
                    ) from exc
            time.sleep(POLL)

    def _answers(self) -> None:
        """Return if the server takes connections; raise while it does not yet. By
        default a ``SELECT 1`` on ``_ready_url``."""
        engine = create_engine(self._ready_url, poolclass=NullPool)
        try:
            with engine.connect() as connection:
                connection.execute(text("SELECT 1"))
        finally:
            engine.dispose()

    def stop(self) -> None:
        """Shut the server down cleanly and wait for it to exit; kill it if it hangs."""
        process, self._process = self._process, None
        if process is None or process.poll() is not None:
            return
        began = time.monotonic()
        process.send_signal(self.stop_signal)
        try:
            process.wait(STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            raise RuntimeError(
                f"{self.name} did not shut down within {STOP_TIMEOUT:g} s:\n{_tail(self.log)}"
            ) from None
        self.last_stop_seconds = time.monotonic() - began

    def restart(self) -> None:
        """A clean shutdown, then the same data directory served again on the same port."""
        self.stop()
        self.start()

    def close(self) -> None:
        """Kill the server if it runs and remove its directory if it made it."""
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            process.kill()
            process.wait()
        if self._made_root:
            shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self: _ServerT) -> _ServerT:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def _check_call(self, command: list[str], user: str | None = None) -> None:
        with self.log.open("ab") as log:
            result = subprocess.run(
                command,
                check=False,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                user=user,
            )
        if result.returncode:
            raise ServerUnavailable(
                f"{Path(command[0]).name} failed with {result.returncode}:\n{_tail(self.log)}"
            )


def program(*candidates: str) -> str:
    """The path of the first of ``candidates`` that is installed.

    :raises ServerUnavailable: none is.
    """
    for candidate in candidates:
        found = shutil.which(candidate)
        if found is not None:
            return found
    if len(candidates) == 1:
        raise ServerUnavailable(f"{candidates[0]} is not installed")
    raise ServerUnavailable(f"none of {', '.join(candidates)} is installed")


class MariaDBServer(Server):
    name = "mariadb"

    def __init__(self) -> None:
        self.install_db = program("mariadb-install-db", "mysql_install_db")
        self.mariadbd = program("mariadbd", "/usr/sbin/mariadbd", "mysqld", "/usr/sbin/mysqld")
        super().__init__()

    @property
    def url(self) -> str:
        return f"mysql+pymysql://root@127.0.0.1:{self.port}/test"

    @property
    def _ready_url(self) -> str:
        return f"mysql+pymysql://root@127.0.0.1:{self.port}/"

    def _options(self) -> list[str]:
        # --no-defaults first: the machine's option files point at the shared server.
        # A tmpdir of its own: servers bootstrapping side by side in /tmp trip over
        # each other's temporary tables ("Could not remove temporary table").
        options = ["--no-defaults", f"--datadir={self.data}", f"--tmpdir={self.root}"]
        if os.geteuid() == 0:
            options.append("--user=root")
        # A small redo log and buffer pool: the tests write a few rows.
        return [*options, "--innodb-log-file-size=8M", "--innodb-buffer-pool-size=16M"]

    def _initialize(self) -> None:
        # "normal": root may log in over TCP with an empty password, as on the shared
        # server; the default would allow root through the Unix socket only.
        self._check_call(
            [
                self.install_db,
                *self._options(),
                "--auth-root-authentication-method=normal",
                "--skip-test-db",
                "--skip-name-resolve",
            ]
        )

    def _command(self) -> list[str]:
        return [
            self.mariadbd,
            *self._options(),
            f"--port={self.port}",
            "--bind-address=127.0.0.1",
            f"--socket={self.root / 'mariadb.sock'}",
            f"--pid-file={self.root / 'mariadb.pid'}",
            "--skip-name-resolve",
            "--skip-log-bin",
        ]

    def _after_first_start(self) -> None:
        engine = create_engine(self._ready_url, poolclass=NullPool)
        try:
            with engine.begin() as connection:
                connection.execute(text("CREATE DATABASE IF NOT EXISTS test"))
        finally:
            engine.dispose()


def _postgresql_bindir() -> Path:
    found = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/postgres"),
        key=lambda path: int(Path(path).parent.parent.name),
    )
    if found:
        return Path(found[-1]).parent
    return Path(program("postgres")).parent


class PostgreSQLServer(Server):
    name = "postgresql"
    stop_signal = signal.SIGINT

    def __init__(self) -> None:
        self.bindir = _postgresql_bindir()
        for program in ("initdb", "postgres"):
            if not (self.bindir / program).exists():
                raise ServerUnavailable(f"{self.bindir / program} is not installed")
        self.user: str | None = None
        if os.geteuid() == 0:
            # PostgreSQL refuses to run as root; it runs as its own system user, which
            # must own the data directory.
            self.user = "postgres"
            try:
                pwd.getpwnam(self.user)
            except KeyError:
                raise ServerUnavailable("running as root and there is no postgres user") from None
        super().__init__()
        if self.user is not None:
            shutil.chown(self.root, self.user)

    @property
    def url(self) -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/postgres"

    def _run_as(self) -> str | None:
        return self.user

    def _initialize(self) -> None:
        self._check_call(
            [
                str(self.bindir / "initdb"),
                f"--pgdata={self.data}",
                "--username=postgres",
                "--auth=trust",
                "--encoding=UTF8",
                "--locale=C.UTF-8",
                "--no-sync",
            ],
            user=self.user,
        )

    def _command(self) -> list[str]:
        return [
            str(self.bindir / "postgres"),
            "-D",
            str(self.data),
            "-c",
            f"port={self.port}",
            "-c",
            "listen_addresses=127.0.0.1",
            "-c",
            f"unix_socket_directories={self.root}",
            "-c",
            "shared_buffers=16MB",
        ]


SERVERS: dict[str, type[Server]] = {"mariadb": MariaDBServer, "postgresql": PostgreSQLServer}


def private_server(name: str) -> Server:
    """A running private server of kind ``name`` ("mariadb" or "postgresql").

    :raises ServerUnavailable: its programs are missing or it would not start; nothing
        is left behind.
    """
    server = SERVERS[name]()
    server.initialize_and_start()
    return server


def _main() -> None:
    """Start each server, restart it once, and print how long that took."""
    for name in SERVERS:
        began = time.monotonic()
        with contextlib.closing(private_server(name)) as server:
            created = time.monotonic() - began
            server.restart()
            print(
                f"{name}: created and started in {created:.2f} s, "
                f"stopped in {server.last_stop_seconds:.2f} s, "
                f"started again in {server.last_start_seconds:.2f} s"
            )


if __name__ == "__main__":
    _main()
