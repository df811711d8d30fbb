"""Private, throw-away Redis servers for the tests that restart one, set a password,
speak TLS, or form a cluster: each on a free loopback port, with its files in a
directory of the test's own, killed at the end.

::

    server = RedisServer(tmp_path / "redis", "--appendonly", "yes")
    server.start()
    ...
    server.restart()
    server.close()
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import redis
from servers import POLL, READY_TIMEOUT, Server, ServerUnavailable, free_ports, program

__all__ = ["RedisCluster", "RedisServer", "self_signed_certificate"]

# Nodes of a private cluster: three primaries, no replicas, the fewest Redis allows.
CLUSTER_NODES = 3


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

    def _answers(self) -> None:
        with self.client() as client:
            client.ping()


class RedisCluster:
    """A private cluster of three primaries; its URL is ``redis+cluster://`` on the
    first node (the client finds the others)."""

    def __init__(self, directory: Path) -> None:
        # Each node's cluster bus on a free port of its own: by default it is the node's
        # port + 10000, which may be in the ephemeral range, taken by any connection.
        ports = free_ports(2 * CLUSTER_NODES)
        self.nodes = []
        for number in range(CLUSTER_NODES):
            node = RedisServer(
                directory / f"node{number}",
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                "nodes.conf",
                "--cluster-port",
                str(ports[2 * number + 1]),
            )
            node.port = ports[2 * number]
            self.nodes.append(node)

    @property
    def url(self) -> str:
        return f"redis+cluster://127.0.0.1:{self.nodes[0].port}/0"

    def start(self) -> None:
        for node in self.nodes:
            node.start()
        addresses = [f"127.0.0.1:{node.port}" for node in self.nodes]
        made = subprocess.run(
            [program("redis-cli"), "--cluster", "create", *addresses, "--cluster-yes"],
            check=False,
            capture_output=True,
            text=True,
        )
        if made.returncode:
            raise ServerUnavailable(f"redis-cli --cluster create failed:\n{made.stdout}")
        deadline = time.monotonic() + READY_TIMEOUT
        for node in self.nodes:
            with node.client() as client:
                while client.cluster("info").get("cluster_state") != "ok":
                    if time.monotonic() > deadline:
                        raise ServerUnavailable("the cluster did not come up")
                    time.sleep(POLL)

    def close(self) -> None:
        for node in self.nodes:
            node.close()
