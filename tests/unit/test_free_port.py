"""The loopback ports the tests hand to sglang (a TP rank's gloo store, a server's --port): free, and outside the
kernel's ephemeral range, from which any outgoing connection could take the port before sglang binds it."""

from __future__ import annotations

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
