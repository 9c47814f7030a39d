"""Every route of the app that names a call (`{call_id}`) reaches the call's owner: the
cluster's `CALL_PATHS` (another node's call is forwarded there) and the workers'
`OWNED_PATHS` (another worker's call is passed there) must both cover it, or the route
answers 404 for a call that lives elsewhere. Checked against the routes the app really
registers (with SIP and telephony on), so a new call route cannot be forgotten again."""

from __future__ import annotations

from agent.media_agent import AgentSettings, MediaAgent
from agent.plugins.echo import EchoPlugin
from agent.worker_tag import ID_TOKEN_BYTES, tagged_token
from signaling.app import create_app
from signaling.cluster.routing import CALL_PATHS
from signaling.sip.config import SipConfig
from signaling.sip.service import install
from signaling.telephony import TelephonyConfig
from signaling.workers.routing import OWNED_PATHS


def call_routes() -> list[tuple[str, str]]:
    app = create_app(MediaAgent(EchoPlugin(), AgentSettings()),
                     telephony_config=TelephonyConfig())
    install(app, SipConfig(listen_port=0))
    return sorted({(route.method, route.resource.canonical) for route in app.router.routes()
                   if route.resource is not None and "{call_id}" in route.resource.canonical
                   and route.method != "HEAD"})


def test_every_call_route_is_routed_to_the_calls_owner_by_both_tables() -> None:
    routes = call_routes()
    # the SIP routes are among them (the ones the cluster once missed)
    assert ("GET", "/v1/sip/calls/{call_id}") in routes
    assert ("POST", "/v1/realtime/calls/{call_id}/accept") in routes
    call_id = "sip_" + tagged_token(ID_TOKEN_BYTES)
    missing = []
    for method, canonical in routes:
        path = canonical.replace("{call_id}", call_id)
        for name, table in (("cluster CALL_PATHS", CALL_PATHS),
                            ("workers OWNED_PATHS", OWNED_PATHS)):
            matches = [m for m in (p.match(path) for p in table) if m is not None]
            if not any(m.group(1) == call_id for m in matches):
                missing.append(f"{method} {canonical} (not in {name})")
    assert not missing, missing
