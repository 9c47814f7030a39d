"""Property-based fuzzing of every surface a client controls: never a 5xx, never a traceback.

A real server (echo plugin) runs on 127.0.0.1 in a thread of its own; hypothesis sends it
SDP offers, JSON bodies and multipart sessions over HTTP, and drives the data-channel and
media-stream parsers and the RTP / RFC 4733 packet paths directly. Each case must end in a
coded 4xx (or a success), a coded error, or a packet that is counted and ignored; afterwards
the server still answers `/health` and nothing was logged at ERROR level. `derandomize=True`
keeps CI deterministic.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from aiohttp import web
from aiortc.rtp import RtpPacket
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent.errors import AgentError
from agent.media_agent import AgentSettings, MediaAgent
from agent.plugins.echo import EchoPlugin
from agent.realtime.events import parse_client_event
from agent.telephony.media_stream import parse_message
from agent.telephony.rtp_jitter import JitterBuffer
from agent.telephony.telephone_event import TelephoneEventDetector
from signaling.app import create_app

FUZZ = settings(max_examples=60, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
CASES: dict[str, int] = {}  # cases run per surface (printed with -s at the end of the module)

OFFER_LINES = [
    "v=0", "o=- 1 1 IN IP4 127.0.0.1", "s=-", "t=0 0", "a=group:BUNDLE 0",
    "m=audio 9 UDP/TLS/RTP/SAVPF 111 0", "c=IN IP4 0.0.0.0", "a=mid:0", "a=sendrecv",
    "a=rtpmap:111 opus/48000/2", "a=rtpmap:0 PCMU/8000", "a=ice-ufrag:abcd",
    "a=ice-pwd:abcdefghijklmnopqrstuvwx", "a=fingerprint:sha-256 " + ":".join(["AB"] * 32),
    "a=setup:actpass", "a=rtcp-mux",
]

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=40),
    lambda inner: (st.lists(inner, max_size=5)
                   | st.dictionaries(st.text(max_size=12), inner, max_size=5)),
    max_leaves=25,
)
sdp_texts = st.one_of(
    st.text(max_size=600),
    # The template with lines dropped, repeated or replaced: close to a real offer.
    st.lists(st.sampled_from(OFFER_LINES) | st.text(max_size=60), min_size=1, max_size=24)
    .map("\r\n".join),
)


class ServerThread:
    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.ready = threading.Event()
        self.port = 0
        self.thread = threading.Thread(target=self._run, name="fuzz-server", daemon=True)
        self.thread.start()
        assert self.ready.wait(30), "server did not start"

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_until_complete(self._start())
        self.ready.set()
        self.loop.run_forever()

    async def _start(self) -> None:
        agent = MediaAgent(EchoPlugin(), AgentSettings(max_calls=8))
        self.runner = web.AppRunner(create_app(agent))
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(30)

    def request(self, method: str, path: str, body: bytes | None,
                content_type: str) -> tuple[int, dict[str, Any] | str]:
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.port}{path}", data=body, method=method,
            headers={"Content-Type": content_type})
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                status, text = response.status, response.read().decode("utf-8", "replace")
        except urllib.error.HTTPError as error:
            status, text = error.code, error.read().decode("utf-8", "replace")
        try:
            return status, json.loads(text)
        except ValueError:
            return status, text


@pytest.fixture(scope="module")
def server() -> Iterator[ServerThread]:
    running = ServerThread()
    yield running
    status, _ = running.request("GET", "/health", None, "application/json")
    assert status == 200  # still serving after every surface was fuzzed
    running.stop()
    print("fuzz cases per surface:", json.dumps(CASES, sort_keys=True))


@pytest.fixture(autouse=True)
def no_error_logs(caplog: pytest.LogCaptureFixture) -> Iterator[None]:
    with caplog.at_level(logging.ERROR):
        yield
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert not errors, [r.getMessage() for r in errors][:3]


def assert_coded(surface: str, status: int, body: dict[str, Any] | str, server: ServerThread,
                 call_path: str | None = None) -> None:
    CASES[surface] = CASES.get(surface, 0) + 1
    assert status < 500, (surface, status, body)
    if status >= 400:
        assert isinstance(body, dict) and isinstance(body["error"]["code"], str), body
    elif call_path is not None:  # a case that happened to make a call: hang it up
        server.request("DELETE", call_path, None, "application/json")


@FUZZ
@given(sdp=sdp_texts)
def test_sdp_offers(server: ServerThread, sdp: str) -> None:
    status, body = server.request("POST", "/v1/realtime/calls", sdp.encode("utf-8", "replace"),
                                  "application/sdp")
    assert_coded("sdp", status, body, server)
    if status == 201:
        pytest.fail("a fuzzed offer made a call")  # the template has no ICE candidates


@FUZZ
@given(body=json_values)
def test_offer_json_bodies(server: ServerThread, body: Any) -> None:
    status, answer = server.request("POST", "/offer", json.dumps(body).encode(),
                                    "application/json")
    assert_coded("offer_json", status, answer, server)


@FUZZ
@given(session=st.text(max_size=300) | json_values.map(json.dumps), sdp=st.text(max_size=200))
def test_multipart_sessions(server: ServerThread, session: str, sdp: str) -> None:
    boundary = "fuzzboundary7"
    parts = []
    for name, value in (("sdp", sdp), ("session", session)):
        parts.append(f"--{boundary}\r\nContent-Disposition: form-data; name=\"{name}\"\r\n\r\n"
                     f"{value}\r\n")
    body = ("".join(parts) + f"--{boundary}--\r\n").encode("utf-8", "replace")
    status, answer = server.request("POST", "/v1/realtime/calls", body,
                                    f"multipart/form-data; boundary={boundary}")
    assert_coded("multipart", status, answer, server)


messages = st.text(max_size=400) | json_values.map(json.dumps) | st.binary(max_size=200)
PARSERS = {"data_channel": parse_client_event, "media_stream": parse_message}


@pytest.mark.parametrize("surface", sorted(PARSERS))
@FUZZ
@given(raw=messages)
def test_client_messages(surface: str, raw: str | bytes) -> None:
    """Data-channel events and media-stream messages: parsed, or a coded error."""
    CASES[surface] = CASES.get(surface, 0) + 1
    try:
        message = PARSERS[surface](raw)
    except AgentError as refused:
        assert refused.code and refused.status < 500
        return
    assert isinstance(message, dict)
    if surface == "data_channel":
        assert isinstance(message["type"], str)


@FUZZ
@given(datagram=st.binary(max_size=300), payload=st.binary(max_size=16),
       timestamp=st.integers(0, 2**32 - 1), seq=st.integers(0, 2**16 - 1))
def test_rtp_and_telephone_event_packets(datagram: bytes, payload: bytes, timestamp: int,
                                         seq: int) -> None:
    CASES["rtp"] = CASES.get("rtp", 0) + 1
    try:
        packet = RtpPacket.parse(datagram)  # what RtpLeg.on_datagram does first
    except ValueError:
        packet = None  # counted as malformed and dropped by the leg
    detector, buffer = TelephoneEventDetector(), JitterBuffer(3)
    for _ in range(3):
        digit = detector.feed(timestamp, payload)
        assert digit is None or digit in "0123456789*#ABCD"
    if packet is not None:
        buffer.push(packet.sequence_number, packet.payload)
    buffer.push(seq, payload)
    for _ in range(6):
        buffer.pop()

