"""The daemon's ends of a sandbox's pipes: a request written whole, output read to its end."""

from __future__ import annotations

import asyncio
import os

from tooljaild.sandbox.channels import PipeReader, PipeWriter


class _Collect(asyncio.Protocol):
    def __init__(self) -> None:
        self.data = bytearray()
        self.ended: asyncio.Future[Exception | None] = asyncio.get_running_loop().create_future()

    def data_received(self, data: bytes) -> None:
        self.data += data

    def connection_lost(self, exc: Exception | None) -> None:
        self.ended.set_result(exc)


async def test_a_request_larger_than_the_pipe_arrives_whole_then_end_of_file() -> None:
    """A 5 MiB request (a pipe holds 64 KiB) goes in as the reader makes room."""
    r, w = os.pipe()
    request = bytes(range(256)) * (5 * 4096)
    reader = _Collect()
    PipeReader(r, reader)
    writer = PipeWriter(w)
    writer.write_and_close(request)
    assert writer.is_closing()  # the rest is pending
    assert await asyncio.wait_for(reader.ended, 10) is None
    assert bytes(reader.data) == request
    assert writer.is_closing()


async def test_a_request_to_a_reader_that_is_gone_is_dropped_quietly() -> None:
    r, w = os.pipe()
    os.close(r)
    writer = PipeWriter(w)
    writer.write_and_close(b"x" * 100_000)  # EPIPE: nothing to tell, nothing raised
    assert writer.is_closing()
    writer.close()  # and closing again is harmless


async def test_closing_a_reader_tells_its_protocol_once() -> None:
    r, w = os.pipe()
    collect = _Collect()
    reader = PipeReader(r, collect)
    os.write(w, b"early")
    await asyncio.sleep(0.05)
    reader.close()
    reader.close()
    assert await collect.ended is None
    assert bytes(collect.data) == b"early"
    os.close(w)
