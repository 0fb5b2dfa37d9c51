"""The request loop of an intercepted tunnel: each request checked, swapped, sent.

`Interception` reads the sandbox's HTTP/1.1 requests, one after another on the
kept-alive connection, out of the TLS session `intercept_tls.TLSServer`
terminated. Each one's Host (and an absolute target) must be the CONNECT host
(`host_mismatch`); placeholders of secrets for this host are swapped for their
values, and a placeholder of a secret for another host, in a header, the URL or
the body, is refused as a `secret_leak` before any byte of that request leaves
(the body is scanned as `intercept_upstream.HeldWriter` holds it back). A GET
to a package index being cached may be answered from the cache instead.
"""

from __future__ import annotations

import asyncio
import os
import ssl
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import BinaryIO, Protocol

from tooljaild.egress.http_bodies import copy_body
from tooljaild.egress.http_heads import (
    NO_BODY,
    BadRequest,
    HeadClosed,
    Headers,
    RequestHead,
    ResponseHead,
    read_request_head,
    request_framing,
)
from tooljaild.egress.http_targets import parse_authority, parse_target
from tooljaild.egress.intercept_tls import TLSServer
from tooljaild.egress.intercept_upstream import (
    HOLD_BYTES,
    CacheWriter,
    HeldWriter,
    Upstream,
    UpstreamError,
    forwardable,
    pass_answer,
    wants_close,
)
from tooljaild.egress.policy import HeldSecret
from tooljaild.egress.refusals import response
from tooljaild.egress.swap import BodyLeakScanner, SecretLeak, swap_request

IDLE_TIMEOUT_S = 60.0
"""How long a kept-alive connection waits for the sandbox's next request head."""
_PIECE = 64 * 1024
"""How much of a cached file is sent at once."""


class PackageCache(Protocol):
    """What interception needs of the package cache (egress/package_cache.py)."""

    def wants(self, host: str) -> bool: ...
    def lookup(self, url: str) -> Path | None: ...
    def writer(self, url: str) -> CacheWriter | None: ...


Account = Callable[[int, int], None]
"""Called with (bytes_out, bytes_in) after each request."""
Deny = Callable[[str, str], None]
"""Called with (reason, detail) for each refusal; the detail never holds a secret."""


def _refusal(host: str, port: int, reason: str, why: str) -> bytes:
    return response(403, "Forbidden", f"tooljail egress: refused {host}:{port} ({reason}): {why}\n")


class Interception:
    """One intercepted client connection: its requests, one after another."""

    def __init__(
        self,
        tls: TLSServer,
        *,
        host: str,
        port: int,
        upstream: Upstream,
        secrets: Sequence[HeldSecret],
        account: Account,
        deny: Deny,
        cache: PackageCache | None,
    ) -> None:
        self._tls = tls
        self._cache = cache
        self._host = host
        self._port = port
        self._upstream = upstream
        self._secrets = secrets
        self._account = account
        self._deny = deny

    async def _send(self, data: bytes) -> None:
        self._tls.write(data)
        await self._tls.drain()

    async def _refuse(self, reason: str, detail: str, why: str) -> None:
        self._deny(reason, detail)
        await self._send(_refusal(self._host, self._port, reason, why))

    async def run(self) -> None:
        """Serve requests until the sandbox or the upstream ends the connection."""
        try:
            while await self._one():
                pass
        finally:
            await self._upstream.drop()

    def _origin_target(self, head: RequestHead) -> str | None:
        """The target in origin-form, None when it names another host."""
        if head.target.startswith("/") or (head.target == "*" and head.method == "OPTIONS"):
            return head.target
        scheme, host, port, path = parse_target(head)
        if scheme != "https" or (host, port) != (self._host, self._port):
            return None
        return path

    def _host_matches(self, head: RequestHead) -> bool:
        value = head.host_header
        if value is None:
            return False
        try:
            host, port = parse_authority(value)
        except BadRequest:
            return False
        return host == self._host and (443 if port is None else port) == self._port

    async def _one(self) -> bool:
        """Serve one request; whether the connection stays open for another."""
        try:
            async with asyncio.timeout(IDLE_TIMEOUT_S):
                head = await read_request_head(self._tls.reader)
        except (HeadClosed, TimeoutError, ConnectionError):
            return False
        except BadRequest as exc:
            self._deny("bad_request", exc.reason)
            await self._send(response(400, "Bad Request", f"tooljail egress: {exc.reason}\n"))
            return False
        if not self._host_matches(head):
            shown = head.host_header or "(none)"
            await self._refuse(
                "host_mismatch",
                f"Host {shown}",
                f"the Host header ({shown}) is not the host this tunnel was opened to",
            )
            return False
        try:
            target = self._origin_target(head)
        except BadRequest as exc:
            target, reason = None, exc.reason
        else:
            reason = "the request names another host than the tunnel's"
        if target is None:
            await self._refuse("host_mismatch", "request target", reason)
            return False
        try:
            new_target, headers = swap_request(
                head.method, target, head.headers, self._host, self._port, self._secrets
            )
        except SecretLeak as leak:
            await self._leak(leak)
            return False
        except ValueError as exc:
            await self._send(response(500, "Internal Server Error", f"tooljail egress: {exc}\n"))
            return False
        extra = [(new, old) for (_, new), (_, old) in zip(headers, head.headers, strict=True)]
        cache_url = None
        if (
            self._cache is not None
            and head.method in ("GET", "HEAD")
            and new_target == target
            and self._cache.wants(self._host)
        ):
            # A URL that held a secret is never a cache key.
            authority = self._host if self._port == 443 else f"{self._host}:{self._port}"
            cache_url = f"https://{authority}{target}"
            if await self._send_cached(cache_url, head):
                return not wants_close(head.version, head.headers)
        try:
            return await self._exchange(head, new_target, headers, extra, cache_url)
        except UpstreamError as exc:
            await self._upstream.drop()
            await self._send(
                response(
                    502,
                    "Bad Gateway",
                    f"tooljail egress: {self._host}:{self._port} failed: {exc}\n",
                )
            )
            return False

    async def _send_cached(self, url: str, head: RequestHead) -> bool:
        """Answer from the package cache; False on a miss (or an unreadable file)."""
        assert self._cache is not None
        if request_framing(head) != NO_BODY:
            return False
        loop = asyncio.get_running_loop()
        path = await loop.run_in_executor(None, self._cache.lookup, url)
        if path is None:
            return False
        try:
            file: BinaryIO = await loop.run_in_executor(None, path.open, "rb")
        except OSError:
            return False
        try:
            size = os.fstat(file.fileno()).st_size
            close = wants_close(head.version, head.headers)
            reply = ResponseHead(
                "HTTP/1.1",
                200,
                "OK",
                [
                    ("Content-Type", "application/octet-stream"),
                    ("Content-Length", str(size)),
                    *([("Connection", "close")] if close else []),
                ],
            )
            await self._send(reply.to_bytes())
            if head.method == "GET":
                while data := await loop.run_in_executor(None, file.read, _PIECE):
                    await self._send(data)
        finally:
            file.close()
        return True

    async def _leak(self, leak: SecretLeak) -> None:
        await self._refuse(
            "secret_leak",
            f"{leak.secret} in the {leak.where}",
            f"the placeholder of secret {leak.secret} was sent in the {leak.where} to a host "
            "that secret is not for; nothing of this request was sent",
        )

    async def _exchange(
        self,
        head: RequestHead,
        target: str,
        headers: Headers,
        extra: Headers,
        cache_url: str | None,
    ) -> bool:
        framing = request_framing(head)
        expect = (head.get("expect") or "").strip().lower() == "100-continue"
        forward = [(k, v) for k, v in forwardable(headers) if k.lower() != "expect"]
        out_head = RequestHead(head.method, target, "HTTP/1.1", forward)
        scanner = BodyLeakScanner(self._secrets, self._host, self._port)

        def scan(chunk: bytes) -> bytes:
            scanner.feed(chunk)
            return chunk

        held = HeldWriter(self._upstream.connect, HOLD_BYTES)
        held.write(out_head.to_bytes())
        bytes_in = 0
        try:
            # The client waits for a 100 before its body: the proxy answers it,
            # since the upstream is not dialled until the body is scanned.
            if expect and framing != NO_BODY:
                await self._send(b"HTTP/1.1 100 Continue\r\n\r\n")
            try:
                await copy_body(self._tls.reader, held, framing, on_chunk=scan)
            except SecretLeak as leak:
                if held.started:
                    # Cut mid-body: the upstream never gets a whole request.
                    await self._upstream.drop()
                await self._leak(leak)
                return False
            except BadRequest as exc:
                await self._upstream.drop()
                self._deny("bad_request", exc.reason)
                await self._send(response(400, "Bad Request", f"tooljail egress: {exc.reason}\n"))
                return False
            try:
                await held.flush()
            except (OSError, ssl.SSLError) as exc:
                raise UpstreamError(f"the request could not be sent: {exc}") from exc
            tee_for = self._tee_for(cache_url)
            keep, bytes_in = await pass_answer(
                self._upstream,
                self._tls,
                head,
                secrets=self._secrets,
                extra=extra,
                tee_for=tee_for,
            )
            return keep
        finally:
            self._account(held.written if held.started else 0, bytes_in)

    def _tee_for(self, cache_url: str | None) -> Callable[[], CacheWriter | None] | None:
        cache = self._cache
        if cache_url is None or cache is None:
            return None
        return lambda: cache.writer(cache_url)
