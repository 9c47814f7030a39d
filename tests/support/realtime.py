"""A real aiortc caller for the `/v1/realtime/calls` API, kept open so tests can drive it."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import numpy as np
import pytest
from aiortc import (
    RTCConfiguration,
    RTCIceServer,
    RTCIceTransportPolicy,
    RTCPeerConnection,
    RTCSessionDescription,
)
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack

from agent.testing.peer import PEER_RATE, Recording, SignalTrack
from agent.testing.testsignal import make_test_signal

CALLS = "/v1/realtime/calls"


def strip_candidates(sdp: str) -> tuple[str, list[tuple[str, str]]]:
    """The SDP without candidates, and the (mid, candidate line) pairs taken out."""
    kept, taken = [], []
    mid = None
    for line in sdp.splitlines():
        if line.startswith("m="):
            mid = None
        if line.startswith("a=mid:"):
            mid = line[6:]
        if line.startswith("a=candidate:"):
            taken.append((mid or "", line))
            continue
        if line == "a=end-of-candidates":
            continue
        kept.append(line)
    return "\r\n".join(kept) + "\r\n", taken


def sdpfrag(ufrag: str, pwd: str, candidates: list[tuple[str, str]], end: bool = True) -> str:
    lines = [f"a=ice-ufrag:{ufrag}", f"a=ice-pwd:{pwd}"]
    by_mid: dict[str, list[str]] = {}
    for mid, line in candidates:
        by_mid.setdefault(mid, []).append(line)
    for mid, lines_for_mid in by_mid.items():
        lines += ["m=audio 9 UDP/TLS/RTP/SAVPF 0", f"a=mid:{mid}", *lines_for_mid]
        if end:
            lines.append("a=end-of-candidates")
    return "\r\n".join(lines) + "\r\n"


def ice_credentials(sdp: str) -> tuple[str, str]:
    ufrag = next(line[12:] for line in sdp.splitlines() if line.startswith("a=ice-ufrag:"))
    pwd = next(line[10:] for line in sdp.splitlines() if line.startswith("a=ice-pwd:"))
    return ufrag, pwd


class RealtimeClient:
    """One call: mic = a test signal, an "oai-events" channel, recorded agent audio."""

    def __init__(self, base_url: str, *, token: str | None = None, seconds: float = 30.0,
                 ice_servers: list[RTCIceServer] | None = None, relay_only: bool = False,
                 signal: np.ndarray | None = None, ordered: bool = True) -> None:
        self.base_url = base_url.rstrip("/")
        self.token = token
        policy = RTCIceTransportPolicy.RELAY if relay_only else RTCIceTransportPolicy.ALL
        self.pc = RTCPeerConnection(
            RTCConfiguration(iceServers=list(ice_servers or []), iceTransportPolicy=policy)
        )
        self.signal = signal if signal is not None else make_test_signal(seconds)
        self.source = SignalTrack(self.signal)
        self.recording = Recording()
        self.events: list[dict[str, Any]] = []
        self._event_added = asyncio.Condition()
        self.connected = asyncio.Event()
        self.channel_open = asyncio.Event()
        self.location: str | None = None
        self.etag: str | None = None
        self.response_headers: Any = None
        self._tasks: list[asyncio.Task[None]] = []
        self.pc.on("connectionstatechange", self._on_state)
        self.pc.on("track", self._on_track)
        self.channel = self.pc.createDataChannel("oai-events", ordered=ordered)
        self.channel.on("message", self._on_message)
        self.channel.on("open", self.channel_open.set)
        self.pc.addTrack(self.source)

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"} if self.token else {}

    @property
    def call_id(self) -> str:
        assert self.location is not None
        return self.location.rsplit("/", 1)[-1]

    def _on_state(self) -> None:
        if self.pc.connectionState == "connected":
            self.connected.set()

    def _on_track(self, track: MediaStreamTrack) -> None:
        async def record() -> None:
            while True:
                try:
                    self.recording.add(await track.recv())
                except MediaStreamError:
                    return
        self._tasks.append(asyncio.ensure_future(record()))

    def _on_message(self, message: str | bytes) -> None:
        event = json.loads(message)
        self.events.append(event)

        async def notify() -> None:
            async with self._event_added:
                self._event_added.notify_all()
        self._tasks.append(asyncio.ensure_future(notify()))

    async def offer_sdp(self) -> str:
        await self.pc.setLocalDescription(await self.pc.createOffer())
        return self.pc.localDescription.sdp

    async def post(self, http: aiohttp.ClientSession, sdp: str,
                   session: dict[str, Any] | None = None, multipart: bool = False,
                   voice_audio: bytes | None = None) -> aiohttp.ClientResponse:
        url = self.base_url + CALLS
        if multipart or session is not None or voice_audio is not None:
            form = aiohttp.FormData(default_to_multipart=True)
            form.add_field("sdp", sdp)
            if session is not None:
                form.add_field("session", json.dumps(session))
            if voice_audio is not None:
                form.add_field("voice_audio", voice_audio, filename="voice.wav",
                               content_type="audio/wav")
            return await http.post(url, data=form, headers=self.headers)
        return await http.post(url, data=sdp,
                               headers={**self.headers, "Content-Type": "application/sdp"})

    async def call(self, session: dict[str, Any] | None = None, *, multipart: bool = False,
                   connect_timeout: float = 15.0, voice_audio: bytes | None = None) -> None:
        """Offer, take the answer, wait until connected. Raises on refusal."""
        sdp = await self.offer_sdp()
        async with aiohttp.ClientSession() as http:
            response = await self.post(http, sdp, session, multipart, voice_audio)
            async with response:
                body = await response.text()
                self.response_headers = response.headers
                if response.status != 201:
                    raise AssertionError(f"offer refused: {response.status} {body}")
                self.location = response.headers["Location"]
                self.etag = response.headers.get("ETag")
            await self.pc.setRemoteDescription(RTCSessionDescription(body, "answer"))
        await asyncio.wait_for(self.connected.wait(), connect_timeout)

    async def wait_event(self, event_type: str, timeout: float = 10.0,
                         after: int = 0) -> dict[str, Any]:
        async def find() -> dict[str, Any]:
            async with self._event_added:
                while True:
                    for event in self.events[after:]:
                        if event.get("type") == event_type:
                            return event
                    await self._event_added.wait()
        return await asyncio.wait_for(find(), timeout)

    def ignore_max_message_size(self) -> None:
        """Send messages of any size, like a client that ignores `a=max-message-size`."""
        self.pc.sctp._remote_max_message_size = 0  # aiortc checks it only when non-zero

    async def send_event(self, event: dict[str, Any] | str | bytes) -> int:
        """Send a client event; returns the index the reply events will start at."""
        await asyncio.wait_for(self.channel_open.wait(), 10)
        mark = len(self.events)
        self.channel.send(event if isinstance(event, (str, bytes)) else json.dumps(event))
        return mark

    async def wait_audio(self, seconds: float, timeout: float = 20.0) -> None:
        async def enough() -> None:
            while self.received_seconds < seconds:
                await asyncio.sleep(0.05)
        await asyncio.wait_for(enough(), timeout)

    @property
    def received_seconds(self) -> float:
        return sum(len(c) for c in self.recording.chunks) / PEER_RATE

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await asyncio.wait_for(self.pc.close(), 5)


@pytest.fixture
async def realtime_clients() -> AsyncIterator[list[RealtimeClient]]:
    """Collects clients a test makes; every one is closed afterwards."""
    clients: list[RealtimeClient] = []
    yield clients
    await asyncio.gather(*(client.close() for client in clients), return_exceptions=True)



async def offer_sdp_once() -> str:
    """A valid audio + data channel offer from a throwaway aiortc peer."""
    pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    try:
        pc.createDataChannel("oai-events")
        pc.addTransceiver("audio", direction="sendrecv")
        await pc.setLocalDescription(await pc.createOffer())
        return pc.localDescription.sdp
    finally:
        await pc.close()
