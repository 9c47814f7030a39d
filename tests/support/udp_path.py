"""A userspace UDP path between a WebRTC caller and the agent on loopback, for tests and
benchmarks of network changes: each side sees the other at this path's sockets (the caller's
and the agent's candidates are rewritten to point here), and datagrams are relayed between
their real addresses. A new path is a new network (new addresses on both sides); `drop`
cuts it (a dead network). Written here because no Debian or PyPI tool relays UDP between
two rewritten ICE candidates and can be cut from inside the test's event loop."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import cast


class _Side(asyncio.DatagramProtocol):
    def __init__(self, path: UdpPath, faces_caller: bool) -> None:
        self.path = path
        self.faces_caller = faces_caller
        self.transport: asyncio.DatagramTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.DatagramTransport, transport)

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        self.path.forward(data, self.faces_caller)


@dataclass
class UdpPath:
    """Two loopback sockets: the caller sees the agent at `caller_side`, the agent sees the
    caller at `agent_side`; datagrams are relayed between the real addresses learned from
    the candidates rewritten to point here. A new path is a new network; `drop` cuts it."""

    caller_side: _Side
    agent_side: _Side
    caller_real: tuple[str, int] | None = None
    agent_real: tuple[str, int] | None = None
    drop: bool = False
    relayed: int = 0

    @classmethod
    async def open(cls) -> UdpPath:
        loop = asyncio.get_running_loop()
        path = cls.__new__(cls)
        UdpPath.__init__(path, _Side(path, True), _Side(path, False))
        await loop.create_datagram_endpoint(lambda: path.caller_side,
                                            local_addr=("127.0.0.1", 0))
        await loop.create_datagram_endpoint(lambda: path.agent_side,
                                            local_addr=("127.0.0.1", 0))
        return path

    def address(self, side: _Side) -> tuple[str, int]:
        assert side.transport is not None
        address: tuple[str, int] = side.transport.get_extra_info("sockname")[:2]
        return address

    def forward(self, data: bytes, from_caller: bool) -> None:
        if self.drop:
            return
        target = self.agent_real if from_caller else self.caller_real
        out = self.agent_side if from_caller else self.caller_side
        if target is not None and out.transport is not None:
            out.transport.sendto(data, target)
            self.relayed += 1

    def _rewrite(self, text: str, to_side: _Side, caller: bool) -> str:
        host, port = self.address(to_side)
        lines = []
        seen: list[tuple[str, int]] = []
        for line in text.split("\r\n"):
            fields = line.split(" ")
            if line.startswith("a=candidate:") and len(fields) > 7 and fields[7] == "host":
                real = (fields[4], int(fields[5]))
                if not seen:  # the BUNDLE's transport: the first media section's
                    seen.append(real)
                    if caller:
                        self.caller_real = real
                    else:
                        self.agent_real = real
                fields[4], fields[5] = host, str(port)
                line = " ".join(fields)
            lines.append(line)
        return "\r\n".join(lines)

    def from_caller(self, text: str) -> str:
        """Caller SDP text as the agent should see it (candidates at this path)."""
        return self._rewrite(text, self.agent_side, caller=True)

    def from_agent(self, text: str) -> str:
        """Agent SDP text as the caller should see it."""
        return self._rewrite(text, self.caller_side, caller=False)

    def close(self) -> None:
        for side in (self.caller_side, self.agent_side):
            if side.transport is not None:
                side.transport.close()
