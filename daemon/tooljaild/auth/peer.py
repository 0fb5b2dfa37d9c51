"""Who is calling on the Unix socket without tokens: the kernel's word, by uid.

gRPC's Python server never shows a Unix peer's credentials (its auth context is
empty there, and `context.peer()` of a Unix connection is "unix:"). So the
daemon's own relay (`tooljaild.app.relay`) accepts each connection on the public
socket, reads the peer's uid with `SO_PEERCRED`, and relays the connection to
gRPC's private socket (in a 0700 directory only the daemon's uid reaches) from
a socket bound to an abstract address that names that uid:
`relay_address(uid)`. gRPC then reports that address as the peer, and
`peer_uid(context.peer())` reads the uid back.

Nobody else can forge that address where it counts: anyone may bind an
abstract name, but only the daemon's uid (and root) can connect to the private
socket, and they are operators anyway. A connection there from any other
address (root dialling the private socket, or TCP) names no uid: `peer_uid`
answers None.

`uid_identity(uid)` is the identity of a uid that is not an operator: named
"uid:N" (no tokens-file identity can be named so: a name there has no ':'),
with the default policy (every tool, the daemon's per-client bounds). Its
calls, sessions and artifacts are its own, and every bound on a client counts
for the uid as a whole, whatever client name its processes send.
"""

from __future__ import annotations

import os
import re
import secrets

from tooljaild.auth.policy import Identity

__all__ = ["RELAY_PREFIX", "operator_uids", "peer_uid", "relay_address", "uid_identity"]

RELAY_PREFIX = "tooljail-peer/uid="
"""The abstract name's start (after its NUL byte): the uid and a nonce follow."""

_PEER = re.compile(r"unix-abstract:" + re.escape(RELAY_PREFIX) + r"([0-9]{1,10})/[0-9a-f]{16}")


def relay_address(uid: int) -> bytes:
    """A fresh abstract Unix address that names `uid` (a random nonce makes it unique).

    Bytes, with the leading NUL that makes it abstract (no file, nothing to remove).
    """
    return b"\0" + f"{RELAY_PREFIX}{uid}/{secrets.token_hex(8)}".encode()


def peer_uid(peer: str) -> int | None:
    """The uid a relayed connection's peer address names (`context.peer()`); None
    for any other peer (TCP, or a connection straight to the private socket)."""
    match = _PEER.fullmatch(peer)
    return None if match is None else int(match.group(1))


def operator_uids(extra: tuple[int, ...] | frozenset[int] = ()) -> frozenset[int]:
    """The uids that are operators: root, the daemon's own, and `extra` ([auth] operator_uids)."""
    return frozenset({0, os.geteuid(), *extra})


def uid_identity(uid: int) -> Identity:
    """The identity of a caller known by its uid alone (see the module doc)."""
    return Identity(name=f"uid:{uid}")
