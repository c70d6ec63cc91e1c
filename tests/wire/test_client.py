"""The collector client's retries (``laggard.wire.client``): against real sockets on loopback."""

from __future__ import annotations

import socket
import threading

import pytest

from laggard.wire.client import Client, CollectorDown


class _Silent:
    """A listening socket that takes connections, reads what comes and never answers (a server that
    is stopped or wedged: the kernel still accepts for it); counts the connections."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        self.held: list[socket.socket] = []
        threading.Thread(target=self._loop, daemon=True).start()

    def _loop(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted += 1
            self._take(conn)

    def _take(self, conn: socket.socket) -> None:
        self.held.append(conn)

    def close(self) -> None:
        self.sock.close()
        for c in self.held:
            c.close()


class _Closing(_Silent):
    """Closes its first connection before any answer (a kept-alive connection the server dropped),
    answers on the next: the client must reconnect and ask again."""

    def _take(self, conn: socket.socket) -> None:
        if self.accepted == 1:
            conn.close()  # the first connection is closed before any answer
            return
        conn.recv(65536)
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}")
        self.held.append(conn)


def test_a_server_that_does_not_answer_in_time_is_asked_once():
    srv = _Silent()
    try:
        client = Client(f"http://127.0.0.1:{srv.port}", None, timeout_s=0.5)
        with pytest.raises(CollectorDown, match="timed out"):
            client.raw("GET", "/healthz", None, None)
        assert srv.accepted == 1
    finally:
        srv.close()


def test_a_connection_the_server_closed_is_made_again_once():
    srv = _Closing()
    try:
        client = Client(f"http://127.0.0.1:{srv.port}", None, timeout_s=5.0)
        assert client.raw("GET", "/healthz", None, None)[0] == 200
        assert srv.accepted == 2
    finally:
        srv.close()
