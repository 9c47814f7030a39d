"""`--webhook-url URL`: POST `realtime.call.ended` for every call that ends, on any transport.

Body: `{"type": "realtime.call.ended", "data": {"call_id", "reason", "duration_s",
"transport", "recording": PATH or null, "plugin", "ended_at"}}`, signed with the Standard
Webhooks headers (`webhook-id`, `webhook-timestamp`, `webhook-signature`) by the
`standardwebhooks` package under `--webhook-secret` / `AGENT_WEBHOOK_SECRET`, as the SIP
`realtime.call.incoming` webhook is, so receivers verify both with the same library.

Off the call path: the leg registry tells this module a leg ended (a list append, nothing
awaited), the event waits in a bounded queue (`QUEUE_LIMIT`; a full queue drops the event
and counts it), and `SENDERS` tasks post them: each event gets up to `ATTEMPTS` tries with
exponential backoff, every try bounded by `ATTEMPT_TIMEOUT` and the whole delivery by
`DELIVERY_DEADLINE`. A failing receiver is logged once when deliveries start failing and once
when they succeed again. `/metrics` counts `agent_call_webhooks_total{outcome}` (delivered,
failed, dropped) and `agent_call_webhook_retries_total`. At shutdown the queue gets
`SHUTDOWN_GRACE` seconds to empty (the calls the shutdown ended included).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import secrets
import time
from collections.abc import AsyncIterator, Iterator
from datetime import datetime, timezone
from typing import Any
from urllib.parse import urlsplit

import aiohttp
from aiohttp import web
from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector
from standardwebhooks import Webhook

from agent.cli_errors import exit_with_error
from agent.leg import Leg
from agent.logs.log_safe import printable
from signaling.keys import AGENT_KEY

log = logging.getLogger(__name__)

# The signing secret of both webhooks (this one and the SIP `realtime.call.incoming`).
WEBHOOK_SECRET_ENV = "AGENT_WEBHOOK_SECRET"
EVENT_TYPE = "realtime.call.ended"
QUEUE_LIMIT = 1024  # ended calls waiting to be posted
SENDERS = 4  # posts in flight at once
ATTEMPTS = 4
BACKOFF_S = 0.5  # before the second try; doubled before each later one
ATTEMPT_TIMEOUT = 5.0
DELIVERY_DEADLINE = 30.0
SHUTDOWN_GRACE = 3.0
OUTCOMES = ("delivered", "failed", "dropped")


def check_webhook_secret(secret: str) -> str:
    """A Standard Webhooks secret (`whsec_` + base64); ValueError otherwise."""
    try:
        Webhook(secret)
    except Exception:
        raise ValueError("the webhook secret must be a Standard Webhooks secret: 'whsec_' "
                         "followed by base64") from None
    return secret


def ended_event(leg: Leg) -> dict[str, Any]:
    """The `realtime.call.ended` body for a leg that has just ended."""
    recorder = leg.recorder
    recording = (str(recorder.audio_path)
                 if recorder is not None and recorder.audio_path.exists() else None)
    return {
        "type": EVENT_TYPE,
        "data": {
            "call_id": leg.id,
            "reason": leg.end_reason,
            "duration_s": round(time.monotonic() - leg.watchdog.started_at, 3),
            "transport": leg.transport,
            "recording": recording,
            "plugin": leg.plugin.id,
            "ended_at": int(time.time()),
        },
    }


def new_message_id() -> str:
    """A Standard Webhooks `webhook-id`: one per event, the same on every try of it."""
    return "msg_" + secrets.token_hex(12)


def signed_headers(signer: Webhook, message_id: str, body: bytes) -> dict[str, str]:
    """The headers of a webhook POST of the JSON `body`, signed now by `signer` (Standard
    Webhooks: `webhook-id`, `webhook-timestamp`, `webhook-signature`); this webhook and the
    SIP `realtime.call.incoming` one both send these."""
    now = datetime.now(timezone.utc)
    return {
        "Content-Type": "application/json",
        "webhook-id": message_id,
        "webhook-timestamp": str(int(now.timestamp())),
        "webhook-signature": signer.sign(message_id, now, body),
    }


class CallEndedWebhook:
    def __init__(self, url: str, secret: str) -> None:
        self.url = url
        self._signer = Webhook(secret)
        self._queue: asyncio.Queue[dict[str, Any]] | None = None
        self._senders: list[asyncio.Task[None]] = []
        self._http: aiohttp.ClientSession | None = None
        self.counts = dict.fromkeys(OUTCOMES, 0)
        self.retries = 0
        self._failing = False

    # -- the call path: never awaits ----------------------------------------------------------

    def on_leg_ended(self, leg: Leg) -> None:
        if self._queue is None:
            return  # not started, or stopped
        try:
            self._queue.put_nowait(ended_event(leg))
        except asyncio.QueueFull:
            self.counts["dropped"] += 1
            if self.counts["dropped"] == 1 or self.counts["dropped"] % QUEUE_LIMIT == 0:
                log.warning("call-ended webhook: queue full (%d waiting); %d events dropped "
                            "so far", QUEUE_LIMIT, self.counts["dropped"])

    # -- delivery -----------------------------------------------------------------------------

    async def start(self) -> None:
        self._queue = asyncio.Queue(QUEUE_LIMIT)
        self._http = aiohttp.ClientSession()
        self._senders = [asyncio.ensure_future(self._send_loop()) for _ in range(SENDERS)]

    async def stop(self) -> None:
        queue = self._queue
        if queue is not None:
            try:
                await asyncio.wait_for(queue.join(), SHUTDOWN_GRACE)
            except asyncio.TimeoutError:
                log.warning("call-ended webhook: %d events not delivered at shutdown",
                            queue.qsize())
        self._queue = None
        for task in self._senders:
            task.cancel()
        await asyncio.gather(*self._senders, return_exceptions=True)
        self._senders = []
        if self._http is not None:
            await self._http.close()
            self._http = None

    async def _send_loop(self) -> None:
        queue = self._queue
        assert queue is not None
        while True:
            event = await queue.get()
            try:
                try:
                    delivered = await asyncio.wait_for(self._deliver(event), DELIVERY_DEADLINE)
                except asyncio.TimeoutError:
                    delivered = False
                self._settled(event, delivered)
            finally:
                queue.task_done()

    async def _deliver(self, event: dict[str, Any]) -> bool:
        body = json.dumps(event).encode()
        message_id = new_message_id()  # the same id on every try
        for attempt in range(ATTEMPTS):
            if attempt:
                self.retries += 1
                await asyncio.sleep(BACKOFF_S * 2 ** (attempt - 1))
            if await self._post(message_id, body):
                return True
        return False

    async def _post(self, message_id: str, body: bytes) -> bool:
        assert self._http is not None
        headers = signed_headers(self._signer, message_id, body)
        try:
            async with self._http.post(
                    self.url, data=body, headers=headers, allow_redirects=False,
                    timeout=aiohttp.ClientTimeout(total=ATTEMPT_TIMEOUT)) as reply:
                await reply.read()
                self._last_problem = f"answered {reply.status}"
                return 200 <= reply.status < 300
        except (aiohttp.ClientError, OSError, asyncio.TimeoutError) as exc:
            self._last_problem = repr(exc)
            return False

    _last_problem = ""

    def _settled(self, event: dict[str, Any], delivered: bool) -> None:
        self.counts["delivered" if delivered else "failed"] += 1
        if delivered and self._failing:
            self._failing = False
            log.info("call-ended webhook: deliveries to %s succeed again", printable(self.url))
        elif not delivered and not self._failing:
            self._failing = True
            log.warning("call-ended webhook: %s for call %s failed after %d tries (%s); further "
                        "failures are counted in /metrics, not logged", printable(self.url),
                        event["data"]["call_id"], ATTEMPTS, printable(self._last_problem))


class WebhookCollector(Collector):
    """The webhook's counters for /metrics, read at scrape time."""

    def __init__(self, webhook: CallEndedWebhook) -> None:
        self.webhook = webhook

    def collect(self) -> Iterator[Metric]:
        outcomes = CounterMetricFamily("agent_call_webhooks", "realtime.call.ended webhooks "
                                       "by outcome (--webhook-url).", labels=["outcome"])
        for outcome in OUTCOMES:
            outcomes.add_metric([outcome], self.webhook.counts[outcome])
        yield outcomes
        yield CounterMetricFamily("agent_call_webhook_retries",
                                  "Repeated tries of realtime.call.ended webhooks.",
                                  value=self.webhook.retries)


WEBHOOK_KEY = web.AppKey("call_ended_webhook", CallEndedWebhook)


def install(app: web.Application, webhook: CallEndedWebhook) -> None:
    """Post every ended leg of the app's agent to the webhook, from start-up to clean-up."""
    app[WEBHOOK_KEY] = webhook
    agent = app[AGENT_KEY]

    async def lifetime(app: web.Application) -> AsyncIterator[None]:
        await webhook.start()
        agent.legs.ended_listeners.append(webhook.on_leg_ended)
        collector = WebhookCollector(webhook)
        agent.metrics.registry.register(collector)
        try:
            yield
        finally:
            # Clean-up runs after the shutdown ended every call: their events go out first.
            await webhook.stop()
            agent.legs.ended_listeners.remove(webhook.on_leg_ended)
            agent.metrics.registry.unregister(collector)

    app.cleanup_ctx.append(lifetime)


# -- command line -------------------------------------------------------------------------------


def _webhook_url(text: str) -> str:
    parts = urlsplit(text)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise argparse.ArgumentTypeError(f"expected an http(s) URL, not {text!r}")
    return text


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--webhook-url", type=_webhook_url, default=None, metavar="URL",
                        help="POST realtime.call.ended here when any call ends (signed with "
                        f"--webhook-secret or ${WEBHOOK_SECRET_ENV}; default: off)")


def settings_from_args(args: argparse.Namespace) -> tuple[str, str] | None:
    """(URL, secret) with --webhook-url, else None; exits with a coded line when the signing
    secret is missing or malformed."""
    if not args.webhook_url:
        return None
    secret = args.webhook_secret or os.environ.get(WEBHOOK_SECRET_ENV) or None
    if secret is None:
        exit_with_error("webhook_secret_missing", f"--webhook-url needs a signing secret: "
                        f"set {WEBHOOK_SECRET_ENV} (or --webhook-secret) to a whsec_... secret")
    try:
        check_webhook_secret(secret)
    except ValueError as exc:
        exit_with_error("webhook_secret_invalid", str(exc))
    return args.webhook_url, secret
