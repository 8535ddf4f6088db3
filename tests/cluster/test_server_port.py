"""Ports for servers that bind later: outside the range outgoing connections draw from."""

from __future__ import annotations

import pathlib
import socket

from dvml.cluster.processes import ephemeral_ports, port_is_free, server_port


def test_a_server_port_is_free_and_below_the_ephemeral_range() -> None:
    low, _ = ephemeral_ports()
    ports = {server_port() for _ in range(20)}
    assert all(p < low for p in ports), (sorted(ports), low)
    assert all(port_is_free(p) and port_is_free(p, "0.0.0.0") for p in ports)
    assert len(ports) > 1  # picked at random, not one fixed port


def test_a_port_held_on_every_address_is_not_free_and_the_range_is_read(
    tmp_path: pathlib.Path,
) -> None:
    """A listener on 0.0.0.0 blocks 127.0.0.1 too; the range file is the kernel's format."""
    (tmp_path / "range").write_text("40000\t60999\n")
    assert ephemeral_ports(str(tmp_path / "range")) == (40000, 60999)
    assert ephemeral_ports(str(tmp_path / "missing")) == (32768, 60999)
    with socket.socket() as held:
        held.bind(("0.0.0.0", server_port()))
        port = held.getsockname()[1]
        assert not port_is_free(port) and not port_is_free(port, "0.0.0.0")
