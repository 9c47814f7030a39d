"""The SIP user agent's place in the aiohttp app: started and stopped with it.

`install_from_args(app, args)` is the one call the CLI makes: without `--sip-listen` it does
nothing. The agent starts listening during app start-up and, at clean-up (after the app's
shutdown ended every leg, whose BYEs are then on their way), gives those BYEs a moment and
closes its sockets. `GET /metrics/sip` shows its calls, transactions and counters (auth as
for `/metrics/calls`). With several workers only worker 0 serves SIP.
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import AsyncIterator

from aiohttp import web

from agent.cli_errors import CliError, exit_with_error
from signaling.call_limit import add_pending_calls
from signaling.keys import AGENT_KEY
from signaling.serving import ALL_SERVING_KEY
from signaling.sip.api import install_routes
from signaling.sip.config import SipConfig, config_from_args
from signaling.sip.outbound import Dialer
from signaling.sip.outbound_api import install_routes as install_outbound_routes
from signaling.sip.refer import Transfers
from signaling.sip.ua import UserAgent
from signaling.telephony import TELEPHONY_KEY, TelephonyConfig

log = logging.getLogger(__name__)

STATS_PATH = "/metrics/sip"


class SipService:
    """Holds the running user agent (None before start-up and after clean-up)."""

    def __init__(self, config: SipConfig) -> None:
        self.config = config
        self.ua: UserAgent | None = None
        self.dialer: Dialer | None = None  # outbound calls (outbound.py)
        self.transfers: Transfers | None = None  # REFER (refer.py)


SIP_SERVICE_KEY = web.AppKey("sip_service", SipService)


def install(app: web.Application, config: SipConfig) -> SipService:
    service = SipService(config)
    app[SIP_SERVICE_KEY] = service

    async def lifetime(app: web.Application) -> AsyncIterator[None]:
        telephony = app.get(TELEPHONY_KEY) or TelephonyConfig()
        ua = UserAgent(app[AGENT_KEY], config, telephony.rtp)
        # Worker 0 of several: an INVITE rings until every worker serves (serving.py).
        ua.admitting = app.get(ALL_SERVING_KEY)
        try:
            await ua.start()
        except OSError as exc:
            await ua.stop()
            raise CliError("sip_listen_failed", f"cannot listen for SIP on "
                           f"{config.listen_host}:{config.listen_port}: {exc.strerror or exc}"
                           ) from None
        service.ua = ua
        dialer, transfers = Dialer(ua), Transfers(ua)
        service.dialer, service.transfers = dialer, transfers
        try:
            yield
        finally:
            service.ua = service.dialer = service.transfers = None
            await transfers.close()
            await dialer.close()
            await ua.stop()

    app.cleanup_ctx.append(lifetime)
    add_pending_calls(app, lambda: pending_outbound(service))  # held while they ring
    app.router.add_get(STATS_PATH, get_stats)
    install_routes(app, lambda app: app[SIP_SERVICE_KEY].ua)  # accept/reject (--sip-webhook)
    install_outbound_routes(app, running_services)  # /v1/sip/calls, .../refer
    return service


def pending_outbound(service: SipService) -> dict[str, object]:
    """The live outbound calls and their owners (those with a leg are counted as legs)."""
    dialer = service.dialer
    return {} if dialer is None else {c.api_id: c.owner for c in dialer.live.values()}


def running_services(app: web.Application) -> tuple[UserAgent, Dialer, Transfers] | None:
    service = app[SIP_SERVICE_KEY]
    if service.ua is None or service.dialer is None or service.transfers is None:
        return None
    return service.ua, service.dialer, service.transfers


async def get_stats(request: web.Request) -> web.Response:
    service = request.app[SIP_SERVICE_KEY]
    ua = service.ua
    if ua is None:
        return web.json_response({"running": False})
    extra = {}
    if service.dialer is not None and service.transfers is not None:
        extra = {"outbound": service.dialer.stats(), "transfers": service.transfers.stats()}
    return web.json_response({"running": True, **ua.stats(), **extra})


def sip_health(app: web.Application) -> dict[str, object] | None:
    """The SIP section of `/health` (None without --sip-listen): what is alive right now, so a
    leak of transactions, dialogs or legs shows between calls."""
    service = app.get(SIP_SERVICE_KEY)
    if service is None:
        return None
    ua = service.ua
    if ua is None:
        return {"running": False}
    outbound = len(service.dialer.live) if service.dialer is not None else 0
    return {"running": True, "transactions": ua.transactions.stats(),
            "dialogs": len(ua.calls) + outbound, "outbound_dialogs": outbound,
            "legs": app[AGENT_KEY].legs.count_by_transport().get("sip", 0),
            "tasks": len(ua.tasks), "invite_limit": ua.guard.stats(),
            "spoofed_in_dialog": ua.counters["spoofed_in_dialog"],
            "internal_errors": ua.counters["internal_errors"]}


def install_from_args(app: web.Application, args: argparse.Namespace) -> None:
    """Serve SIP when --sip-listen asks for it (worker 0 only with several workers)."""
    try:
        config = config_from_args(args)
    except ValueError as exc:
        exit_with_error("sip_config_invalid", str(exc), cause=exc)
    if config is None:
        return
    worker = getattr(args, "worker_index", None)
    if worker not in (None, 0):
        log.info("sip: served by worker 0; worker %d takes none", worker)
        return
    install(app, config)
