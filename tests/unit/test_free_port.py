"""The loopback ports the tests hand to sglang (a TP rank's gloo store, a server's --port): free, and outside the
kernel's ephemeral range, from which any outgoing connection could take the port before sglang binds it."""

from __future__ import annotations

import contextlib
import socket
from pathlib import Path

from eagle3_patches.testing import isolation, server


def _ephemeral_low() -> int:
    path = Path("/proc/sys/net/ipv4/ip_local_port_range")
    return int(path.read_text().split()[0]) if path.exists() else 32768


def test_ports_are_free_and_below_the_ephemeral_range():
    assert server.free_port is isolation.free_port  # one way to pick a port
    low, high = isolation.PORT_RANGE
    assert high <= _ephemeral_low() and high + 10000 <= 65535  # sglang 0.5.11: its gRPC port is --port + 10000
    for _ in range(20):
        port = isolation.free_port()
        assert low <= port < high
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))  # nothing holds it


#: sglang-router 0.3.2's Prometheus listener when the command names none (``launch_router --help``)
ROUTER_METRICS_DEFAULT = 29000


def _flag(command: list[str], name: str) -> str:
    assert command.count(name) == 1, command
    return command[command.index(name) + 1]


def test_each_pair_gives_its_router_a_free_loopback_metrics_port(tmp_path):
    """Without ``--prometheus-port`` every router binds 0.0.0.0:29000, and a second one (two releases of the matrix
    side by side, a developer's router) panicked: "failed to install Prometheus metrics exporter: ... Address
    already in use".  The port is picked as the servers' are: with a router on the default port and the first
    pair's router holding its own, the second pair gets another."""
    with contextlib.ExitStack() as held:

        def listen(host: str, port: int) -> None:
            sock = held.enter_context(socket.socket())
            sock.bind((host, port))
            sock.listen()

        with contextlib.suppress(OSError):  # a router already there does the same
            listen("0.0.0.0", ROUTER_METRICS_DEFAULT)
        first = server.DisaggregatedPair("/nonexistent/model", [], [], log_dir=tmp_path / "a")
        port = int(_flag(first.router_command, "--prometheus-port"))
        assert _flag(first.router_command, "--prometheus-host") == "127.0.0.1"
        assert port != ROUTER_METRICS_DEFAULT and isolation.PORT_RANGE[0] <= port < isolation.PORT_RANGE[1]
        listen("127.0.0.1", port)  # the first pair's router
        second = server.DisaggregatedPair("/nonexistent/model", [], [], log_dir=tmp_path / "b")
        assert int(_flag(second.router_command, "--prometheus-port")) not in (port, ROUTER_METRICS_DEFAULT)
