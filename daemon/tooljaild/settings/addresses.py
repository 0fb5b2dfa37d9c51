"""What a `listen` address means: whether it is loopback, and the daemon's default id.

Plain functions of the settings (no socket is opened), shared by the edge,
which names the daemon in every reply, and the app, which binds the address.
"""

from __future__ import annotations

import ipaddress
import socket

__all__ = ["default_daemon_id", "is_loopback"]


def is_loopback(listen: str) -> bool:
    """Whether a HOST:PORT address is on this host only (127.0.0.1, [::1], localhost)."""
    host = listen.rsplit(":", 1)[0].strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def default_daemon_id(listen: str, port: int) -> str:
    """The daemon's name when the `daemon_id` setting is empty.

    "<hostname>:<port>" on TCP (`port`: the bound one, which port 0 picked),
    "<hostname>:<socket path>" on a Unix socket: unique among daemons on one
    host, and stable across restarts as long as the address is (in a Kubernetes
    pod the hostname is the pod's name).
    """
    host = socket.gethostname()
    if listen.startswith("unix:"):
        return f"{host}:{listen.removeprefix('unix://').removeprefix('unix:')}"
    return f"{host}:{port}"
