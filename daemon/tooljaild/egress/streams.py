"""Closing the proxy's streams: gracefully when there is time, at once when there is not.

A TLS stream's `close()` starts a shutdown that waits for the peer's answer on
the loop's later turns. Cut short (the connection's task cancelled while the
proxy stops), it would leave the transport half closed when the loop closes:
uvloop then refuses to close (EBUSY) and calls back into a closed loop. So a
close that is cancelled or runs out of time aborts the transport, which ends
on the loop's next turn.
"""

from __future__ import annotations

import asyncio
import ssl

__all__ = ["close_writer"]


async def close_writer(writer: asyncio.StreamWriter, grace_s: float) -> None:
    """Close `writer`, waiting up to `grace_s` for its last bytes to leave, else abort.

    Raises:
        asyncio.CancelledError: cancelled meanwhile (the transport is aborted first).
    """
    writer.close()
    try:
        async with asyncio.timeout(grace_s):
            await writer.wait_closed()
    except (TimeoutError, OSError, ssl.SSLError):
        writer.transport.abort()
    except asyncio.CancelledError:
        writer.transport.abort()
        raise
