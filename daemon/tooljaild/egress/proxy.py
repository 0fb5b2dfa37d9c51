"""The egress proxy: one asyncio loop in one daemon thread, serving every sandbox's gate.

The proxy never runs on the gRPC loop: a sandbox's traffic (10,000 connections
at once, slow peers, big downloads) cannot stall a call or an RPC. The daemon
talks to it from its own threads through the thread-safe methods below; the
gates and connections live on the egress loop.

What one connection may do is `tooljaild.egress.connection`'s; this module
owns the thread, the gates and the daemon-wide settings (hosts map, upstream
trust, the interception CA, the package cache).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import uvloop

from tooljaild.egress import connection
from tooljaild.egress.client_conn import CacheWriter, PackageCacheLike
from tooljaild.egress.gate import EgressGate
from tooljaild.egress.hosts import HostsMap
from tooljaild.egress.policy import EgressPolicy
from tooljaild.egress.refusals import DenialLog
from tooljaild.egress.resolve import Lookup, Resolver

if TYPE_CHECKING:
    from tooljaild.egress.tls import InterceptCA

__all__ = ["THREAD_NAME", "CacheWriter", "EgressProxy", "PackageCacheLike"]

log = logging.getLogger("tooljaild.egress")

THREAD_NAME = "tooljail-egress"


class EgressProxy:
    """Every gate of the daemon, served by one loop in one thread.

    Args:
        hosts: the operator's hosts map (`[egress.hosts]`).
        upstream_ca_file: roots trusted upstream besides the system's (`[egress] ca_file`).
        ca: the daemon's interception CA (used when a gate holds secrets).
        cache: the package cache, or None.
        on_denial: called with the reason of every denial (a metric), on the egress thread.
        resolver: resolves names (tests inject one); None: the host's resolver.
    """

    def __init__(
        self,
        *,
        hosts: HostsMap,
        upstream_ca_file: Path | None,
        ca: InterceptCA,
        cache: PackageCacheLike | None = None,
        on_denial: Callable[[str], None] = lambda reason: None,
        resolver: Resolver | None = None,
    ) -> None:
        self._ca = ca
        self._cache = cache
        self._on_denial = on_denial
        self._denial_log = DenialLog(log)
        self._lookup = Lookup(resolver=resolver)
        self._hosts = hosts
        self._upstream_ca_file = upstream_ca_file
        self._upstream_ctx: ssl.SSLContext | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._gates: set[EgressGate] = set()
        self._lock = threading.Lock()

    # -- life ---------------------------------------------------------------

    def start(self) -> None:
        """Start the egress thread and its loop; idempotent."""
        with self._lock:
            if self._thread is not None:
                return
            # uvloop: each loop turn costs a fraction of asyncio's, and a proxied
            # connection is mostly loop turns (decision 175: +1.64 -> +0.68 ms).
            loop = uvloop.new_event_loop()
            started = threading.Event()

            def run() -> None:
                asyncio.set_event_loop(loop)
                loop.call_soon(started.set)
                try:
                    loop.run_forever()
                finally:
                    with contextlib.suppress(Exception):
                        loop.run_until_complete(_cancel_all(loop))
                    try:
                        loop.close()
                    except OSError as exc:  # a handle still open: the daemon stops anyway
                        log.warning("egress: the proxy's loop closed with a handle open: %s", exc)

            thread = threading.Thread(target=run, name=THREAD_NAME, daemon=True)
            thread.start()
            started.wait()
            self._loop, self._thread = loop, thread

    def stop(self) -> None:
        """Close every gate and connection and join the thread; idempotent."""
        with self._lock:
            loop, thread = self._loop, self._thread
            self._loop, self._thread = None, None
            gates = list(self._gates)
            self._gates.clear()
        if loop is None or thread is None:
            return
        for gate in gates:
            gate.close()
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=30)

    def open_gate(
        self, directory: Path, policy: EgressPolicy, *, max_connections: int, label: str
    ) -> EgressGate:
        """A new gate listening on `directory/proxy.sock`; thread-safe.

        Starts the proxy if needed. Returns once the socket listens, without
        waiting for the egress loop (which may be busy with another sandbox's
        flood): the socket is bound here, and the loop starts accepting on its
        next turn; a relay that connects sooner waits in the backlog.

        Raises:
            RuntimeError: called on the egress loop itself, or the proxy stopped.
            OSError: the socket could not be made.
        """
        self.start()
        loop = self._loop
        if loop is None:
            raise RuntimeError("the egress proxy is stopped")
        if threading.current_thread() is self._thread:
            raise RuntimeError("open_gate must not be called on the egress loop")
        gate = EgressGate(
            loop=loop,
            directory=directory,
            policy=policy,
            max_connections=max_connections,
            label=label,
            serve=self._serve,
            denied=self._denied,
            forget=self._forget,
        )

        gate.bind()
        with self._lock:
            self._gates.add(gate)
        try:
            loop.call_soon_threadsafe(gate.watch)
        except RuntimeError:  # stopped meanwhile
            gate.close()
            raise RuntimeError("the egress proxy is stopped") from None
        return gate

    def reconfigure(self, *, hosts: HostsMap, upstream_ca_file: Path | None) -> None:
        """Use a new hosts map and upstream trust for new connections (at reload)."""
        self._hosts = hosts
        if upstream_ca_file != self._upstream_ca_file:
            self._upstream_ca_file = upstream_ca_file
            self._upstream_ctx = None

    @property
    def gates(self) -> int:
        """Gates open now."""
        with self._lock:
            return len(self._gates)

    @property
    def connections(self) -> int:
        """Client connections open now, over every gate (for a gauge; thread-safe)."""
        with self._lock:
            gates = list(self._gates)
        return sum(gate.open_connections for gate in gates)

    def _forget(self, gate: EgressGate) -> None:
        # A closed gate leaves nothing behind: the daemon opens one per sandbox.
        with self._lock:
            self._gates.discard(gate)
        if threading.current_thread() is self._thread:
            self._denial_log.forget(gate.label)

    # -- used by connections (on the loop) -----------------------------------

    @property
    def hosts(self) -> HostsMap:
        return self._hosts

    @property
    def lookup(self) -> Lookup:
        return self._lookup

    @property
    def ca(self) -> InterceptCA:
        return self._ca

    @property
    def cache(self) -> PackageCacheLike | None:
        return self._cache

    def upstream_context(self) -> ssl.SSLContext:
        """TLS trust for intercepted connections upstream (made on first use)."""
        ctx = self._upstream_ctx
        if ctx is None:
            from tooljaild.egress.tls import upstream_context

            ctx = self._upstream_ctx = upstream_context(self._upstream_ca_file)
        return ctx

    def deny(self, gate: EgressGate, host: str, port: int, reason: str, rule: str) -> None:
        """Record a denial: the gate's book, the metric callback, a (rate-limited) log line."""
        self._denied(gate, host, port, reason, rule)

    def _denied(self, gate: EgressGate, host: str, port: int, reason: str, rule: str) -> None:
        gate.book.deny(host, port, reason, rule)
        try:
            self._on_denial(reason)
        except Exception:
            log.exception("egress: the denial callback failed")
        self._denial_log.denied(gate.label, host, port, reason, rule)

    async def _serve(self, gate: EgressGate, sock: socket.socket) -> None:
        await connection.serve(self, gate, sock)


async def _cancel_all(loop: asyncio.AbstractEventLoop) -> None:
    """Cancel every connection's task and let each close what it holds: a
    transport closes on the loop's next turns, which must come before the
    loop closes (else it is left "closing", its socket open)."""
    for _ in range(3):  # a task's cleanup may start others (a closing writer's wait)
        tasks = [t for t in asyncio.all_tasks(loop) if t is not asyncio.current_task()]
        if not tasks:
            break
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    for _ in range(3):
        await asyncio.sleep(0)
