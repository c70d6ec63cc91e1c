"""``free_port``: the port it returns stays out of the kernel's pool for the others, yet a listener that asks
for address reuse (TCPStore, uvicorn, socketserver) binds it at once."""

from __future__ import annotations

import socket

from laggard.collectives.launch import free_port


def test_a_reserved_port_is_not_handed_out_again_but_binds_with_address_reuse() -> None:
    port = free_port()
    taken = set()
    for _ in range(2000):  # what bind(0) and outgoing connections draw from
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            taken.add(s.getsockname()[1])
    assert port not in taken
    with socket.socket() as plain:  # held: a socket that asks for no reuse is refused it
        try:
            plain.bind(("127.0.0.1", port))
            refused = False
        except OSError:
            refused = True
    assert refused, f"port {port} was free to anyone: nothing held it"
    with socket.socket() as listener:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", port))
        listener.listen(1)
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            listener.accept()[0].close()


def test_ports_chosen_together_differ() -> None:
    ports = [free_port() for _ in range(20)]
    assert len(set(ports)) == len(ports)
