"""A private, throw-away ZooKeeper server that a test may stop and start at will.

The shared server serves every test worker, so a test that restarts ZooKeeper gets one
of its own: a configuration and data directory under a temporary directory, a free
loopback port. ``restart()`` is a real one (the JVM shuts down, then serves the same
data directory again); ``close()`` kills it (and removes its directory if the
server made it).

::

    with ZooKeeperServer(tmp_path) as server:
        manager = LockManager(server.url + "/tierlock", ...)
        server.restart()
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

from kazoo.client import KazooClient
from servers import Server, ServerUnavailable

__all__ = ["ZooKeeperServer"]

# Where Debian's zookeeperd puts ZooKeeper; its configuration directory is on the class
# path only for the logging configuration.
CLASS_PATH = "/etc/zookeeper/conf:/usr/share/java/zookeeper.jar"
MAIN = "org.apache.zookeeper.server.ZooKeeperServerMain"
# How long a probe of a starting server waits for a session.
PROBE_TIMEOUT = 1.0
# The probes of a starting server fail until it listens: not worth a warning each.
_quiet = logging.getLogger("zk_servers.probe")
_quiet.setLevel(logging.CRITICAL)


class ZooKeeperServer(Server):
    """One standalone server under ``root``; started by the constructor."""

    name = "zookeeper"

    def __init__(self, root: Path) -> None:
        java = shutil.which("java")
        if java is None or not Path(CLASS_PATH.rpartition(":")[2]).exists():
            raise ServerUnavailable("java or ZooKeeper (Debian's zookeeperd) is not installed")
        self.java = java
        super().__init__(root)
        self.hosts = f"127.0.0.1:{self.port}"
        self.config = self.root / "zoo.cfg"
        self.initialize_and_start()

    @property
    def url(self) -> str:
        """The server's URL, with no chroot."""
        return f"zookeeper://{self.hosts}"

    def _initialize(self) -> None:
        self.config.write_text(
            "tickTime=2000\n"
            f"dataDir={self.data}\n"
            f"clientPort={self.port}\n"
            "clientPortAddress=127.0.0.1\n"
            "admin.enableServer=false\n"
        )

    def _command(self) -> list[str]:
        return [
            self.java,
            f"-Dzookeeper.log.dir={self.root}",
            "-Dzookeeper.root.logger=INFO,CONSOLE",
            "-cp",
            CLASS_PATH,
            MAIN,
            str(self.config),
        ]

    def _answers(self) -> None:
        """A session opens within a second. (A starting server may take the probe's
        connection and never answer its handshake: kazoo waits the session's timeout
        for the answer, which is the probe's second here, not ten.)"""
        client = KazooClient(
            hosts=self.hosts,
            timeout=PROBE_TIMEOUT,
            connection_retry={"max_tries": 0},
            logger=_quiet,
        )
        client.start(timeout=PROBE_TIMEOUT)  # on a timeout it stops and closes the client
        client.stop()
        client.close()
