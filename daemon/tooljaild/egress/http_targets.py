"""Where a proxy request goes: its target and Host authority, read strictly.

A name is lowercased and one trailing dot stripped, an IPv6 literal loses its
brackets; userinfo, a malformed name, address or port is refused with
`BadRequest`, never repaired.
"""

from __future__ import annotations

import re

from tooljaild.egress.http_heads import BadRequest, RequestHead

_REG_NAME = re.compile(r"[a-z0-9](?:[a-z0-9_-]*[a-z0-9])?(?:\.[a-z0-9](?:[a-z0-9_-]*[a-z0-9])?)*")
_PORT = re.compile(r"[0-9]{1,5}")


def _split_authority(authority: str) -> tuple[str, int | None]:
    """(host, port) of `host[:port]` or `[v6][:port]`; host lowercased and checked."""
    if "@" in authority:
        raise BadRequest("userinfo in the request target")
    if authority.startswith("["):
        end = authority.find("]")
        if end < 0:
            raise BadRequest("a malformed IPv6 address")
        host = authority[1:end].lower()
        rest = authority[end + 1 :]
        if not re.fullmatch(r"[0-9a-f:.]+", host):
            raise BadRequest("a malformed IPv6 address")
        if rest and not rest.startswith(":"):
            raise BadRequest("a malformed authority")
        port_text = rest[1:] if rest else None
    else:
        host, colon, port_text_ = authority.rpartition(":")
        if not colon:
            host, port_text = authority, None
        else:
            port_text = port_text_
        host = host.lower()
        if host.endswith("."):
            host = host[:-1]
        if not _REG_NAME.fullmatch(host):
            raise BadRequest("a malformed host name")
    if port_text is None:
        return host, None
    if not _PORT.fullmatch(port_text) or not 0 < int(port_text) < 65536:
        raise BadRequest("a malformed port")
    return host, int(port_text)


def parse_authority(authority: str) -> tuple[str, int | None]:
    """(host, port or None) of a Host header or authority; host lowercased,
    one trailing dot stripped, IPv6 without brackets.

    Raises:
        BadRequest: userinfo, a malformed name, address or port.
    """
    return _split_authority(authority)


def parse_target(head: RequestHead) -> tuple[str, str, int, str]:
    """(scheme, host, port, path) of a proxy request's target.

    absolute-form `http://host[:port]/path?query` (scheme "http" or "https",
    default port 80 / 443, path "/" when empty); CONNECT's authority-form
    `host:port` (scheme "", path "", port required).

    Raises:
        BadRequest: origin-form or another form a proxy is not sent, userinfo,
            a malformed host or port.
    """
    if head.method.upper() == "CONNECT":
        host, port = _split_authority(head.target)
        if port is None:
            raise BadRequest("CONNECT needs host:port")
        return "", host, port, ""
    scheme, sep, rest = head.target.partition("://")
    scheme = scheme.lower()
    if not sep or scheme not in ("http", "https"):
        raise BadRequest("a proxy request needs an absolute http:// URL")
    cut = len(rest)
    for mark in "/?#":
        at = rest.find(mark)
        if 0 <= at < cut:
            cut = at
    authority, path = rest[:cut], rest[cut:]
    if not authority:
        raise BadRequest("an absolute URL without a host")
    host, port = _split_authority(authority)
    path = path.split("#", 1)[0]
    if not path.startswith("/"):
        path = "/" + path
    return scheme, host, port if port is not None else (443 if scheme == "https" else 80), path
