"""HTTPS for a collector (or relay) that listens beyond loopback: ``--tls-cert`` / ``--tls-key``, or ``--insecure``.

Bearer tokens and the dashboard's session cookie travel in every request, so plain HTTP is for
loopback only: binding any other address (``0.0.0.0``, a node's IP, a host name) needs a certificate
and its key (PEM; handed to uvicorn as ``ssl_certfile`` / ``ssl_keyfile``), or ``--insecure`` to
serve plain HTTP there anyway (behind a TLS-terminating proxy, or on a network one trusts). Both
are checked before the port is bound: a key that does not match its certificate, an unreadable
file or a missing flag is one line, and nothing is started or written.

Clients (tracers, relays, ``monitor push``, the runtime controller) speak HTTPS to an ``https://``
URL and verify the certificate against the system's CAs; a private CA or a self-signed certificate
is trusted with ``SSL_CERT_FILE=/path/ca.pem`` in their environment.
"""

from __future__ import annotations

import ipaddress
import socket
import ssl
from pathlib import Path

from laggard.errors import LaggardError


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an address or a name) is this machine's loopback only."""
    name = host.strip("[]")
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        pass
    if name == "localhost":
        return True
    try:
        addrs = {a[4][0] for a in socket.getaddrinfo(name, None)}
    except OSError:
        return False  # not resolvable here: binding it fails anyway, with its own line
    return bool(addrs) and all(ipaddress.ip_address(a.split("%", 1)[0]).is_loopback for a in addrs)


def server_tls(host: str, cert: Path | None, key: Path | None, insecure: bool) -> dict[str, str]:
    """uvicorn's TLS settings for serving on ``host`` (empty: plain HTTP), or one clear ``LaggardError``:
    a certificate without its key (or the reverse), files that do not load, or a non-loopback
    ``host`` without TLS and without ``insecure``."""
    if (cert is None) != (key is None):
        raise LaggardError("--tls-cert and --tls-key go together: give the certificate (PEM) and its private key")
    if cert is None or key is None:
        if not insecure and not is_loopback(host):
            raise LaggardError(f"--host {host} is beyond loopback: serve HTTPS there with --tls-cert CERT.pem "
                               "--tls-key KEY.pem, or pass --insecure for plain HTTP (tokens and data in clear)")
        return {}
    for flag, p in (("--tls-cert", cert), ("--tls-key", key)):
        if not p.is_file():
            raise LaggardError(f"{flag} {p}: no such file")
    try:
        ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(str(cert), str(key), password=lambda: b"")
    except ssl.SSLError as e:
        why = e.reason or str(e)
        raise LaggardError(f"--tls-cert {cert} / --tls-key {key}: cannot serve with them ({why}; PEM files, "
                           "the key unencrypted and matching the certificate)") from None
    except OSError as e:
        raise LaggardError(f"--tls-cert {cert} / --tls-key {key}: cannot read them ({e.strerror or e})") from None
    return {"ssl_certfile": str(cert), "ssl_keyfile": str(key)}


__all__ = ["is_loopback", "server_tls"]
