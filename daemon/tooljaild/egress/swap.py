"""Secret placeholders swapped for values, on the way to their own hosts only.

A sandbox that holds a secret sees only its placeholder ("tooljail-secret-" and
32 random hex characters). In an intercepted request to a host the secret is
for, `swap_request` puts the value where the placeholder was (header values,
`Authorization: Basic` credentials, the URL); a placeholder bound for any other
host is an attempted leak (`SecretLeak`), and so is one in a body to such a host
(`BodyLeakScanner`). Whatever an upstream answers is scrubbed: a value echoed
back becomes its placeholder again (`ResponseScrubber`), so the value never
reaches the sandbox verbatim. (A host a secret is for can be made to return it
transformed — encoded, reversed; the sandbox may talk to that host anyway. The
scrubber covers verbatim and percent-encoded echoes.)

No message raised here holds a value, and no placeholder either: only the
secret's name and where it was found.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Iterable, Sequence
from urllib.parse import quote, unquote

from tooljail.errors import TooljailError
from tooljaild.egress.policy import HeldSecret

# Header values are checked after the swap as http_heads.py checks them on read: a
# value holding CR or LF would split the header it is put in.
_FIELD_VALUE = re.compile(r"[\t\x20-\x7e\x80-\xff]*")
_BASIC = re.compile(r"(?i)(basic)([ \t]+)([A-Za-z0-9+/=_-]+)")
_BASIC_HEADERS = ("authorization", "proxy-authorization")


class SecretLeak(TooljailError):
    """A secret's placeholder was on its way to a host the secret is not for.

    Attributes:
        secret: the secret's name.
        where: "header NAME", "url" or "body".
    """

    def __init__(self, secret: str, where: str) -> None:
        super().__init__(f"the placeholder of secret {secret} was sent in the {where}")
        self.secret = secret
        self.where = where


def _swap_text(
    text: str, secrets: Sequence[HeldSecret], host: str, port: int, where: str, *, url: bool
) -> str:
    # Detection sees the URL decoded too: "%74ooljail-secret-..." is the same
    # placeholder to the server that receives it.
    seen = unquote(text) if url else text
    for secret in secrets:
        if secret.placeholder not in seen:
            continue
        if not secret.allowed_for(host, port):
            raise SecretLeak(secret.name, where)
        # In a URL the value goes percent-encoded: a value holding "&" or "/"
        # must not change the query or path around it.
        # In a header the value goes as its UTF-8 bytes, held as latin-1 text
        # the way http_heads.py holds every header value.
        value = (
            quote(secret.value, safe="-._~")
            if url
            else secret.value.encode("utf-8").decode("latin-1")
        )
        text = text.replace(secret.placeholder, value)
    return text


def _swap_basic(
    value: str, secrets: Sequence[HeldSecret], host: str, port: int, where: str
) -> str | None:
    """`Basic base64(user:pass)` with placeholders in user:pass swapped; None if not Basic."""
    match = _BASIC.fullmatch(value.strip())
    if match is None:
        return None
    try:
        decoded = base64.b64decode(match.group(3), validate=True).decode("latin-1")
    except (binascii.Error, ValueError):
        return None
    swapped = _swap_text(decoded, secrets, host, port, where, url=False)
    if swapped == decoded:
        return None
    encoded = base64.b64encode(swapped.encode("latin-1")).decode("ascii")
    return f"{match.group(1)}{match.group(2)}{encoded}"


def swap_request(
    method: str,
    target: str,
    headers: list[tuple[str, str]],
    host: str,
    port: int,
    secrets: Sequence[HeldSecret],
) -> tuple[str, list[tuple[str, str]]]:
    """Swap placeholders for values in a request bound for `host`:`port`.

    Args:
        method: the request's method (for symmetry with the head; unused).
        target: the request target (origin- or absolute-form).
        headers: the header fields; not modified.
        secrets: the secrets the sandbox holds.

    Returns:
        (target, headers) with every placeholder of a secret allowed for the
        host replaced by its value: in header values, in the credentials of
        `Authorization`/`Proxy-Authorization: Basic`, in the target (percent-encoded).

    Raises:
        SecretLeak: a placeholder of a secret not allowed for the host, in a
            header ("header NAME") or the target ("url").
        ValueError: a value that cannot go in a header (CR, LF, NUL): the
            secrets file is wrong; the message names the secret's header, not
            the value.
    """
    del method
    if not secrets:
        return target, headers
    target = _swap_text(target, secrets, host, port, "url", url=True)
    out: list[tuple[str, str]] = []
    for name, value in headers:
        where = f"header {name}"
        new = _swap_text(value, secrets, host, port, where, url=False)
        if name.lower() in _BASIC_HEADERS:
            basic = _swap_basic(new, secrets, host, port, where)
            if basic is not None:
                new = basic
        if new is not value and not _FIELD_VALUE.fullmatch(new):
            raise ValueError(f"a secret's value cannot go in {where}: it holds a control character")
        out.append((name, new))
    return target, out


class BodyLeakScanner:
    """Watches a request body, in pieces, for placeholders bound elsewhere.

    Only the placeholders of secrets not allowed for the host are looked for.
    A placeholder split across two pieces is found: the last len(longest)-1
    bytes of each piece are kept for the next.
    """

    def __init__(self, secrets: Sequence[HeldSecret], host: str, port: int) -> None:
        self._needles = [
            (s.placeholder.encode("ascii"), s.name)
            for s in secrets
            if not s.allowed_for(host, port)
        ]
        self._keep = max((len(n) for n, _ in self._needles), default=1) - 1
        self._tail = b""

    def feed(self, chunk: bytes) -> None:
        """Look at the next piece of the body.

        Raises:
            SecretLeak: a placeholder of a secret not for this host (where="body").
        """
        if not self._needles:
            return
        window = self._tail + chunk
        for needle, name in self._needles:
            if needle in window:
                raise SecretLeak(name, "body")
        self._tail = window[-self._keep :] if self._keep else b""


def _value_forms(value: str) -> Iterable[bytes]:
    yield value.encode("utf-8")
    encoded = quote(value, safe="-._~")
    if encoded != value:
        yield encoded.encode("ascii")


class ResponseScrubber:
    """Rewrites an upstream's answer so that no secret's value reaches the sandbox.

    Each value (verbatim, and percent-encoded) becomes its placeholder; `extra`
    adds pairs of (what was sent, what the sandbox wrote), such as a whole
    swapped `Authorization` header value, so that an echo of it goes back as
    the sandbox wrote it. A value split across pieces is found: the last
    len(longest)-1 bytes are held back until the next piece or `flush`.
    """

    def __init__(
        self, secrets: Sequence[HeldSecret], extra: Sequence[tuple[str, str]] = ()
    ) -> None:
        pairs: dict[bytes, bytes] = {}
        for sent, wrote in extra:
            if sent and sent != wrote:
                pairs[sent.encode("latin-1")] = wrote.encode("latin-1")
        for secret in secrets:
            if not secret.value:
                continue
            for form in _value_forms(secret.value):
                pairs.setdefault(form, secret.placeholder.encode("ascii"))
        self._pairs = pairs
        # Longest first: where two needles start at one place, the longer wins.
        needles = sorted(pairs, key=len, reverse=True)
        self._pattern = re.compile(b"|".join(re.escape(n) for n in needles)) if needles else None
        self._keep = max((len(n) for n in needles), default=1) - 1
        self._held = b""

    @property
    def active(self) -> bool:
        """Whether there is anything to scrub (else feed returns its input)."""
        return self._pattern is not None

    def _sub(self, data: bytes) -> bytes:
        assert self._pattern is not None
        return self._pattern.sub(lambda match: self._pairs[match.group()], data)

    def feed(self, chunk: bytes) -> bytes:
        """The next piece of the answer, scrubbed (possibly shorter: some held back)."""
        if self._pattern is None:
            return chunk
        window = self._held + chunk
        # Keep back the bytes a needle could still start in; a needle that
        # starts before them ends within the window and is replaced now.
        cut = max(0, len(window) - self._keep)
        # A match reaching into the held-back bytes is replaced now: move the cut after it.
        for match in self._pattern.finditer(window):
            if match.start() < cut < match.end():
                cut = match.end()
        head, held = window[:cut], window[cut:]
        self._held = held
        return self._sub(head)

    def flush(self) -> bytes:
        """What is held back, scrubbed: call once at the end of the answer."""
        if self._pattern is None:
            return b""
        held, self._held = self._held, b""
        return self._sub(held)

    def scrub_text(self, text: str) -> str:
        """A whole text (a header value), scrubbed."""
        if self._pattern is None:
            return text
        return self._sub(text.encode("latin-1")).decode("latin-1")
