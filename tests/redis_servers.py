"""Private, throw-away Redis servers for the tests that restart one, set a password,
speak TLS, or form a cluster: each on a free loopback port, with its files in a
directory of the test's own, killed at the end.

::

    server = RedisServer(tmp_path / "redis", "--appendonly", "yes")
    server.start()
    ...
    server.restart()
    server.close()

    cluster = RedisCluster(tmp_path / "cluster", replicas=1, node_timeout=2000)
    cluster.start()
    primary = cluster.primaries()[1]
    cluster.wait_for_replicas()         # every write so far is on the replicas too
    cluster.cut_replication(primary)    # its replicas copy none of its later writes
    primary.kill()                      # SIGKILL (or SIGSTOP: it hangs)
    cluster.wait_for_failover(primary)  # its replica serves its slots
    cluster.close()
"""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import redis
from servers import POLL, READY_TIMEOUT, Server, ServerUnavailable, free_ports, program

__all__ = ["RedisCluster", "RedisServer", "self_signed_certificate"]

# Primaries of a private cluster: three, the fewest Redis allows.
CLUSTER_NODES = 3
# Starts of a node, each on other ports, when one of its ports was taken meanwhile.
PORT_TRIES = 3


def self_signed_certificate(directory: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 and its key, the certificate its own authority."""
    certificate, key = directory / "server.crt", directory / "server.key"
    subprocess.run(
        [
            program("openssl"),
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=127.0.0.1",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
            "-keyout",
            str(key),
            "-out",
            str(certificate),
        ],
        check=True,
        capture_output=True,
    )
    return certificate, key


class RedisServer(Server):
    """One private ``redis-server`` in ``directory``: ``start()``, ``stop()`` (clean: an
    append-only file is written out), ``restart()``, ``close()`` (kill, and remove its
    files)."""

    name = "redis"

    def __init__(
        self,
        directory: Path,
        *options: str,
        password: str | None = None,
        tls: tuple[Path, Path] | None = None,
    ) -> None:
        """``options`` go to redis-server as given; ``tls``: (certificate, key) to serve
        TLS only, with the certificate as its own authority."""
        super().__init__(directory)
        # redis-server writes its files (an append-only file, a cluster's nodes.conf)
        # there and will not start without it.
        self.data.mkdir(exist_ok=True)
        self.password = password
        self.tls = tls
        self._options = options
        self.frozen = False  # stopped by SIGSTOP: it takes connections but never answers

    @property
    def url(self) -> str:
        scheme = "rediss" if self.tls else "redis"
        secret = f":{self.password}@" if self.password else ""
        query = f"?ssl_ca_certs={self.tls[0]}" if self.tls else ""
        return f"{scheme}://{secret}127.0.0.1:{self.port}/0{query}"

    def _command(self) -> list[str]:
        # No --logfile: redis-server logs to its standard output, the server's log.
        command = [
            program("redis-server"),
            "--bind",
            "127.0.0.1",
            "--dir",
            str(self.data),
            "--save",
            "",
        ]
        if self.tls:
            certificate, key = self.tls
            command += ["--port", "0", "--tls-port", str(self.port)]
            command += ["--tls-cert-file", str(certificate), "--tls-key-file", str(key)]
            command += ["--tls-ca-cert-file", str(certificate), "--tls-auth-clients", "no"]
        else:
            command += ["--port", str(self.port)]
        if self.password:
            command += ["--requirepass", self.password]
        return [*command, *self._options]

    def client(self) -> redis.Redis:
        return redis.Redis.from_url(self.url, decode_responses=True)

    def kill(self, signal_number: signal.Signals = signal.SIGKILL) -> None:
        """Send the server ``signal_number``: SIGKILL ends it at once, without a clean
        shutdown (``start()`` serves its directory again); SIGSTOP freezes it, so that
        connections to it hang; SIGCONT thaws it."""
        if self._process is None or self._process.poll() is not None:
            raise RuntimeError(f"{self.name} is not running")
        self._process.send_signal(signal_number)
        if signal_number == signal.SIGKILL:
            self._process.wait()
            self._process = None
        if signal_number in (signal.SIGSTOP, signal.SIGCONT):
            self.frozen = signal_number == signal.SIGSTOP

    @property
    def responding(self) -> bool:
        """Whether the server runs and is not frozen."""
        return self.running and not self.frozen

    @property
    def linked(self) -> bool:
        """Whether the server is a replica whose link to its primary is up (it copies
        the primary's writes as they come)."""
        with self.client() as client:
            replication = client.info("replication")
        return bool(replication["role"] == "slave" and replication["master_link_status"] == "up")

    def present(self, keys: Iterable[str]) -> set[str]:
        """Which of ``keys`` the server has, unexpired; a cluster node is asked even if
        it is a replica (READONLY), as long as it has the keys' slots."""
        with redis.Redis.from_url(
            self.url, decode_responses=True, single_connection_client=True
        ) as client:
            if client.info("cluster").get("cluster_enabled") == 1:
                client.execute_command("READONLY")
            return {key for key in keys if client.exists(key)}

    def _answers(self) -> None:
        with self.client() as client:
            client.ping()


class RedisCluster:
    """A private cluster of three primaries, each with ``replicas`` replicas of its own;
    its URL is ``redis+cluster://`` on the first node (the client finds the others).

    ``node_timeout``: the ``cluster-node-timeout`` in milliseconds, how long a node may
    stay silent before the others count it failed and promote one of its replicas
    (Redis's default: 15 s).
    """

    def __init__(
        self, directory: Path, *, replicas: int = 0, node_timeout: int | None = None
    ) -> None:
        self.replicas = replicas
        self._directory = directory
        self._options = (
            [] if node_timeout is None else ["--cluster-node-timeout", str(node_timeout)]
        )
        count = CLUSTER_NODES * (1 + replicas)
        # Each node's cluster bus on a free port of its own: by default it is the node's
        # port + 10000, which may be in the ephemeral range, taken by any connection.
        ports = free_ports(2 * count)
        self.nodes = [
            self._node(number, ports[2 * number], ports[2 * number + 1]) for number in range(count)
        ]

    def _node(self, number: int, port: int, bus: int, attempt: int = 0) -> RedisServer:
        node = RedisServer(
            self._directory / f"node{number}-{attempt}",
            "--cluster-enabled",
            "yes",
            "--cluster-config-file",
            "nodes.conf",
            "--cluster-port",
            str(bus),
            *self._options,
        )
        node.port = port
        return node

    @property
    def url(self) -> str:
        return f"redis+cluster://127.0.0.1:{self.nodes[0].port}/0"

    def start(self) -> None:
        """Start the nodes, form the cluster (redis-cli makes the first three nodes
        primaries and the others their replicas) and wait until every node says it
        is up and every replica has copied its primary's data."""
        for number in range(len(self.nodes)):
            self._start(number)
        addresses = [f"127.0.0.1:{node.port}" for node in self.nodes]
        made = subprocess.run(
            [
                program("redis-cli"),
                "--cluster",
                "create",
                *addresses,
                "--cluster-replicas",
                str(self.replicas),
                "--cluster-yes",
            ],
            check=False,
            capture_output=True,
            text=True,
        )
        if made.returncode:
            raise ServerUnavailable(f"redis-cli --cluster create failed:\n{made.stdout}")
        deadline = time.monotonic() + READY_TIMEOUT
        for node in self.nodes:
            with node.client() as client:
                while not _ready(client):
                    if time.monotonic() > deadline:
                        raise ServerUnavailable("the cluster did not come up")
                    time.sleep(POLL)

    def _start(self, number: int) -> None:
        """Start node ``number``, on other ports if another server took one of its own
        between their choice and the start."""
        for attempt in range(1, PORT_TRIES + 1):
            try:
                self.nodes[number].start()
                return
            except ServerUnavailable as exc:
                if "Address already in use" not in str(exc) or attempt == PORT_TRIES:
                    raise
            self.nodes[number].close()
            port, bus = free_ports(2)
            self.nodes[number] = self._node(number, port, bus, attempt)

    def node(self, address: str) -> RedisServer:
        """The node at ``address`` (``host:port``, as a cluster names its nodes)."""
        port = int(address.rpartition(":")[2].partition("@")[0])
        return next(node for node in self.nodes if node.port == port)

    def _view(self) -> dict[str, dict[str, Any]]:
        """CLUSTER NODES as a responding node sees it: flags and slots by address."""
        for node in self.nodes:
            if node.responding:
                with node.client() as client:
                    view: dict[str, dict[str, Any]] = client.cluster("nodes")
                    return view
        raise RuntimeError("no node of the cluster answers")

    def primaries(self) -> list[RedisServer]:
        """The nodes that serve slots now, as a responding node sees it."""
        return [
            self.node(address)
            for address, seen in self._view().items()
            if "master" in seen["flags"] and "fail" not in seen["flags"] and seen["slots"]
        ]

    def replicas_of(self, primary: RedisServer) -> list[RedisServer]:
        """The replicas of ``primary``, as a responding node sees it."""
        view = self._view()
        its_id = view[f"127.0.0.1:{primary.port}"]["node_id"]
        return [self.node(address) for address, seen in view.items() if seen["master_id"] == its_id]

    def cut_replication(self, primary: RedisServer, limit: float = 10.0) -> list[RedisServer]:
        """Cut the replication links of ``primary``: its replicas stay in the cluster,
        and one of them still takes over once it fails, but they copy none of the writes
        it takes from now on. Return them, once each says its link is down.

        The primary turns away the requests by which a replica copies it (PSYNC, SYNC):
        a replica connects as the default user, whose other commands (all a client such
        as tierlock sends) it still takes; then it drops the replicas' connections. Each
        replica tries again every second, and is refused each time (NOPERM).
        """
        replicas = self.replicas_of(primary)
        with primary.client() as client:
            client.execute_command("ACL", "SETUSER", "default", "-psync", "-sync")
            client.client_kill_filter(_type="replica")
        deadline = time.monotonic() + limit
        for replica in replicas:
            while replica.linked:
                if time.monotonic() > deadline:
                    raise AssertionError(f"{replica.port} is still linked to {primary.port}")
                time.sleep(POLL)
        return replicas

    def wait_for_replicas(self, limit: float = 10.0) -> None:
        """Wait until the replicas of each running primary have applied every write it
        has taken so far (as the replicas themselves say: a primary learns of their
        progress only once a second)."""
        deadline = time.monotonic() + limit
        view = self._view()
        for address, seen in view.items():
            if "master" not in seen["flags"] or "fail" in seen["flags"]:
                continue
            with self.node(address).client() as client:
                written = int(client.info("replication")["master_repl_offset"])
            for replica, its in view.items():
                if its["master_id"] != seen["node_id"] or "fail" in its["flags"]:
                    continue
                with self.node(replica).client() as client:
                    while int(client.info("replication")["slave_repl_offset"]) < written:
                        if time.monotonic() > deadline:
                            raise AssertionError(f"the replica {replica} lags behind")
                        time.sleep(POLL / 10)

    def wait_for_failover(self, failed: RedisServer, limit: float = 30.0) -> float:
        """Wait until the nodes that answer count ``failed`` (a primary just killed or
        frozen) failed, a replica of it serves its slots and every such node says the
        cluster is up; the seconds that took."""
        began = time.monotonic()
        slots = self._view()[f"127.0.0.1:{failed.port}"]["slots"]
        while True:
            view = self._view()
            flags = view[f"127.0.0.1:{failed.port}"]["flags"].split(",")
            taken = any(
                seen["slots"] == slots and "master" in seen["flags"] and "fail" not in seen["flags"]
                for address, seen in view.items()
                if address != f"127.0.0.1:{failed.port}"
            )
            if "fail" in flags and taken and all(self._up(node) for node in self.nodes):
                return time.monotonic() - began
            if time.monotonic() - began > limit:
                raise AssertionError(f"no replica took over from {failed.port} in {limit:g} s")
            time.sleep(POLL)

    def _up(self, node: RedisServer) -> bool:
        """Whether ``node`` is down (or frozen) or says the cluster is up."""
        if not node.responding:
            return True
        with node.client() as client:
            return _ready(client)

    def close(self) -> None:
        for node in self.nodes:
            node.close()


def _ready(client: redis.Redis) -> bool:
    """Whether the node says the cluster is up and, if it is a replica, that it has
    copied its primary's data."""
    if client.cluster("info").get("cluster_state") != "ok":
        return False
    replication = client.info("replication")
    return replication["role"] != "slave" or replication.get("master_link_status") == "up"
