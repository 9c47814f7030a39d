"""At most N unauthenticated connections per client address; authenticating frees a place."""

from __future__ import annotations

import asyncio

import pytest

from signaling.address_limit import AddressGate
from tests.support.server_process import running_server

KEY = "sk-address-limit"


async def _connect(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection("127.0.0.1", port)


async def _closed_at_once(reader: asyncio.StreamReader) -> bool:
    try:
        return await asyncio.wait_for(reader.read(1), 2.0) == b""
    except asyncio.TimeoutError:
        return False  # still open: nothing came, nothing closed it
    except ConnectionError:
        return True


async def _request(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, path: str,
                   key: str | None = None) -> bytes:
    auth = f"Authorization: Bearer {key}\r\n" if key else ""
    writer.write(f"GET {path} HTTP/1.1\r\nHost: x\r\n{auth}\r\n".encode())
    await writer.drain()
    return await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)


def test_the_gate_counts_per_address() -> None:
    gate = AddressGate(2)
    assert gate.admit("a") and gate.admit("a") and not gate.admit("a")
    assert gate.admit("b")
    gate.forget("a")
    assert gate.admit("a") and gate.refused == 1


@pytest.mark.slow
async def test_the_next_unauthenticated_connection_is_closed_and_a_key_frees_a_place() -> None:
    async with running_server("--api-key", KEY, "--max-unauthenticated-per-address", "3",
                              "--header-timeout", "60") as (_, url, _lines):
        port = int(url.rsplit(":", 1)[1])
        held = [await _connect(port) for _ in range(3)]
        refused_reader, refused_writer = await _connect(port)
        assert await _closed_at_once(refused_reader)
        refused_writer.close()
        # A refused key is no authentication: that connection still counts.
        head = await _request(*held[0], "/v1/models")
        assert head.startswith(b"HTTP/1.1 401")
        extra_reader, extra_writer = await _connect(port)
        assert await _closed_at_once(extra_reader)
        extra_writer.close()
        # A request with the key frees its connection's place.
        await held[0][0].read(200)  # the 401's body
        head = await _request(*held[1], "/v1/models", key=KEY)
        assert head.startswith(b"HTTP/1.1 200")
        reader, writer = await _connect(port)
        assert not await _closed_at_once(reader)
        assert (await _request(reader, writer, "/health")).startswith(b"HTTP/1.1 200")
        writer.close()
        # Closing connections frees their places too.
        for _, held_writer in held:
            held_writer.close()
        await asyncio.sleep(0.3)
        fresh = [await _connect(port) for _ in range(3)]
        assert not any([await _closed_at_once(r) for r, _ in fresh[:1]])
        for _, fresh_writer in fresh:
            fresh_writer.close()
