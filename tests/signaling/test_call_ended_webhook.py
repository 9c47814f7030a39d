"""`--webhook-url`: the server process posts `realtime.call.ended` for a WebRTC call and a
media-stream call to a real receiver on loopback that verifies every post with the
`standardwebhooks` library; a receiver that fails once is tried again with the same message
id, and /metrics counts deliveries and retries."""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import os
import secrets
import sys
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from prometheus_client.parser import text_string_to_metric_families
from standardwebhooks import Webhook
from standardwebhooks.webhooks import WebhookVerificationError

from agent.call_settings import CallSettings
from agent.leg import Leg
from agent.plugins.echo import EchoPlugin
from agent.ticker import Ticker
from signaling.call_webhook import ATTEMPTS, CallEndedWebhook, new_message_id, signed_headers
from tests.support.agents import wait_until
from tests.support.realtime import RealtimeClient
from tests.support.server_process import running_server

SECRET = "whsec_" + base64.b64encode(secrets.token_bytes(24)).decode()


class Receiver:
    """An application's webhook endpoint: verifies, records, and fails the first try."""

    def __init__(self, secret: str) -> None:
        self.verifier = Webhook(secret)
        self.verified: list[dict[str, Any]] = []
        self.ids: list[str] = []
        self.refused = 0
        self.arrived = asyncio.Event()

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        try:
            payload = self.verifier.verify(body, dict(request.headers))
        except WebhookVerificationError:
            self.refused += 1
            return web.Response(status=400)
        self.ids.append(request.headers["webhook-id"])
        if len(self.ids) == 1:
            return web.Response(status=503)  # the first try fails: it must come again
        self.verified.append(payload)
        self.arrived.set()
        return web.Response(status=204)

    async def wait(self, count: int, timeout: float = 20.0) -> None:
        async def enough() -> None:
            while len(self.verified) < count:
                self.arrived.clear()
                await self.arrived.wait()
        await asyncio.wait_for(enough(), timeout)


def ulaw_message(event: str, **fields: Any) -> str:
    return json.dumps({"event": event, "streamSid": "MZ9", **fields})


async def media_stream_call(url: str) -> None:
    """A bridge that starts, sends a second of silence and stops."""
    async with aiohttp.ClientSession() as http:
        async with http.ws_connect(url + "/v1/telephony/media-stream") as bridge:
            await bridge.send_str(ulaw_message("start", start={
                "streamSid": "MZ9", "callSid": "CA9",
                "mediaFormat": {"encoding": "audio/x-mulaw", "sampleRate": 8000,
                                "channels": 1}}))
            payload = base64.b64encode(bytes([0xFF]) * 160).decode()
            for _ in range(50):
                await bridge.send_str(ulaw_message("media", media={"payload": payload}))
                await asyncio.sleep(0.02)
            await bridge.send_str(ulaw_message("stop"))
            async for _ in bridge:  # until the agent closes it
                pass


async def counters(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    async with aiohttp.ClientSession() as http:
        async with http.get(url + "/metrics") as response:
            text = await response.text()
    return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(text)
            if family.name.startswith("agent_call_webhook")
            for sample in family.samples}


@pytest.mark.slow
async def test_every_call_end_is_posted_signed(tmp_path: Path) -> None:
    receiver = Receiver(SECRET)
    app = web.Application()
    app.router.add_post("/hook", receiver.handle)
    hook = TestServer(app, host="127.0.0.1")
    await hook.start_server()
    records = tmp_path / "records"
    try:
        async with running_server("--webhook-url", str(hook.make_url("/hook")),
                                  "--webhook-secret", SECRET,
                                  "--record-dir", str(records)) as (_, url, _):
            call = RealtimeClient(url, seconds=10)
            try:
                await call.call()
                await call.wait_audio(0.5)
                async with aiohttp.ClientSession() as http:
                    async with http.delete(url + call.location) as response:
                        assert response.status == 200
                await receiver.wait(1)
            finally:
                await call.close()
            await media_stream_call(url)
            await receiver.wait(2)
            metrics = await counters(url)
    finally:
        await hook.close()
    assert receiver.refused == 0
    assert receiver.ids[0] == receiver.ids[1]  # the retry carries the same message id
    webrtc, stream = (event["data"] for event in receiver.verified)
    assert all(event["type"] == "realtime.call.ended" for event in receiver.verified)
    assert (webrtc["call_id"], webrtc["reason"], webrtc["transport"]) == (
        call.call_id, "hangup", "webrtc")
    assert (stream["reason"], stream["transport"]) == ("stop", "media-stream")
    assert stream["call_id"].startswith("media_stream_")
    for data in (webrtc, stream):
        assert data["duration_s"] > 0.5
        assert data["recording"] == str(records / f"{data['call_id']}.flac")
        assert Path(data["recording"]).stat().st_size > 0
    assert metrics[("agent_call_webhooks_total", (("outcome", "delivered"),))] == 2
    assert metrics[("agent_call_webhooks_total", (("outcome", "failed"),))] == 0
    assert metrics[("agent_call_webhook_retries_total", ())] == 1


async def test_a_webhook_url_needs_a_valid_secret() -> None:
    """Refused at start-up, before any worker starts: one coded line, exit 2."""
    hook = ("--webhook-url", "http://127.0.0.1:9/hook")
    for flags, code in ((hook, "webhook_secret_missing"),
                        ((*hook, "--webhook-secret", "whsec_!!!"), "webhook_secret_invalid")):
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "signaling", "--port", "0", "--workers", "2", *flags,
            stderr=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.DEVNULL,
            env={**os.environ, "AGENT_WEBHOOK_SECRET": ""})
        try:
            _, stderr = await asyncio.wait_for(process.communicate(), 30)
        finally:
            if process.returncode is None:
                process.kill()
                await process.wait()
        assert process.returncode == 2, stderr
        assert f"error [{code}]" in stderr.decode()


@pytest.mark.slow
async def test_a_failing_receiver_is_retried_logged_once_and_counted(
        caplog: pytest.LogCaptureFixture) -> None:
    """Every try of two events refused: each is tried ATTEMPTS times with the same id, ends
    as failed, and the log says so once; a later success is logged once too."""
    tries: list[str] = []
    refusing = [True]

    async def handle(request: web.Request) -> web.Response:
        Webhook(SECRET).verify(await request.read(), dict(request.headers))
        tries.append(request.headers["webhook-id"])
        return web.Response(status=500 if refusing[0] else 200)

    app = web.Application()
    app.router.add_post("/hook", handle)
    hook = TestServer(app, host="127.0.0.1")
    await hook.start_server()
    plugin = EchoPlugin()
    ticker = Ticker(plugin)
    webhook = CallEndedWebhook(str(hook.make_url("/hook")), SECRET)
    await webhook.start()
    try:
        legs = [Leg(f"call_{n}", plugin, ticker, CallSettings(), lambda leg: None)
                for n in range(3)]
        for leg in legs:
            await leg.close("hangup")
        with caplog.at_level(logging.INFO, logger="signaling.call_webhook"):
            webhook.on_leg_ended(legs[0])
            webhook.on_leg_ended(legs[1])
            await wait_until(lambda: webhook.counts["failed"] == 2, timeout=30)
            refusing[0] = False
            webhook.on_leg_ended(legs[2])
            await wait_until(lambda: webhook.counts["delivered"] == 1, timeout=30)
    finally:
        await webhook.stop()
        await ticker.close()
        await hook.close()
    assert len(tries) == 2 * ATTEMPTS + 1 and len(set(tries)) == 3
    assert webhook.retries == 2 * (ATTEMPTS - 1)
    lines = [record.getMessage() for record in caplog.records]
    assert sum("failed after" in line for line in lines) == 1
    assert sum("succeed again" in line for line in lines) == 1


def test_signed_headers_verify_with_the_library_and_only_for_their_body() -> None:
    body = json.dumps({"type": "realtime.call.ended"}).encode()
    message_id = new_message_id()
    headers = signed_headers(Webhook(SECRET), message_id, body)
    assert headers["webhook-id"] == message_id and message_id.startswith("msg_")
    assert headers["Content-Type"] == "application/json"
    assert Webhook(SECRET).verify(body, headers) == {"type": "realtime.call.ended"}
    with pytest.raises(WebhookVerificationError):
        Webhook(SECRET).verify(body + b" ", headers)
    assert new_message_id() != message_id
