"""Every route of the app that names a call reaches the call's owner: the workers' routing
(`owner_of`: another worker's call is passed there) and the cluster's (`owner_node`:
another node's call is forwarded there) both send it to the worker and node its id names,
or the route answers 404 for a call that lives elsewhere. Both derive their tables from
the routes' own declarations (signaling/call_route.py, owned_routes.py); this walks the
routes the app really registers (with SIP and telephony on) and asks the two routers
themselves, so a route that names a call cannot be left out of either again."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from aiohttp import web
from aiohttp.test_utils import make_mocked_request

from agent import worker_tag
from agent.media_agent import AgentSettings, MediaAgent
from agent.plugins.echo import EchoPlugin
from agent.worker_tag import ID_TOKEN_CHARS, TAGS
from signaling.app import create_app
from signaling.call_route import CALL_ID, CallRoute
from signaling.cluster.routing import owner_node
from signaling.owned_routes import CALL_ROUTES
from signaling.sideband import SIDEBAND
from signaling.sip.config import SipConfig
from signaling.sip.service import install
from signaling.telephony import TelephonyConfig
from signaling.workers.routing import owner_of

NODE, WORKER = "b", 3
# a call made by worker 3 of node b
CALL = "sip_" + NODE + TAGS[WORKER] + "x" * (ID_TOKEN_CHARS - 2)


@pytest.fixture
def in_a_cluster(monkeypatch: pytest.MonkeyPatch) -> None:
    """This process is worker 0 of node a (ids then carry a node and a worker tag)."""
    monkeypatch.setattr(worker_tag, "_node", "a")
    monkeypatch.setattr(worker_tag, "_tag", "a0")


def full_app() -> web.Application:
    app = create_app(MediaAgent(EchoPlugin(), AgentSettings()),
                     telephony_config=TelephonyConfig())
    install(app, SipConfig(listen_port=0))
    return app


def not_sent_to_owner(app: web.Application) -> tuple[list[str], list[str]]:
    """(routes naming a call that either router would not send to its owner, routes whose
    handler relays to the owner itself)."""
    declared = {route.path: route for route in (*CALL_ROUTES, SIDEBAND)}
    missing, relayed = [], []
    for route in app.router.routes():
        canonical = route.resource.canonical if route.resource is not None else ""
        declaration = declared.get(canonical)
        if declaration is None and CALL_ID not in canonical:
            continue  # names no call
        name = f"{route.method} {canonical}"
        if declaration is not None and declaration.relayed_by_handler:
            relayed.append(name)
            continue
        request = make_mocked_request(route.method, canonical.replace(CALL_ID, CALL), app=app)
        if owner_of(request) != WORKER:
            missing.append(f"{name} (workers: {owner_of(request)})")
        if owner_node(request) != NODE:
            missing.append(f"{name} (cluster: {owner_node(request)})")
    return missing, relayed


def test_every_call_route_is_routed_to_the_calls_owner_by_both_layers(in_a_cluster: None
                                                                      ) -> None:
    app = full_app()
    names = {f"{r.method} {r.resource.canonical}" for r in app.router.routes() if r.resource}
    # the SIP routes are among them (the ones the cluster once missed)
    assert {"GET /v1/sip/calls/{call_id}", "POST /v1/realtime/calls/{call_id}/accept",
            "POST /v1/realtime/calls/{call_id}/refer", "DELETE /v1/telephony/rtp/{call_id}",
            "PATCH /v1/realtime/calls/{call_id}"} <= names
    missing, relayed = not_sent_to_owner(app)
    assert not missing, missing
    # Only the sideband relays itself (a websocket: tests/workers/test_worker_logs.py and
    # tests/cluster/test_cluster.py follow it to its owner); a new one must be looked at.
    assert sorted(relayed) == ["GET /v1/realtime", "HEAD /v1/realtime"]
    # and every declaration is a route the app registers
    assert {route.path for route in CALL_ROUTES} <= {n.split(" ", 1)[1] for n in names}


async def ok(request: web.Request) -> web.Response:
    return web.Response()


@pytest.mark.parametrize("add", [
    # a route naming a call that nobody declared
    lambda router: router.add_post("/v1/realtime/calls/{call_id}/hold", ok),
    # declared, but by a module owned_routes.py does not gather
    lambda router: CallRoute("/v1/telephony/rtp/{call_id}/mute").add(router, "POST", ok),
], ids=["undeclared", "not_gathered"])
def test_a_call_route_the_routers_miss_is_found(
        in_a_cluster: None, add: Callable[[web.UrlDispatcher], object]) -> None:
    app = full_app()
    add(app.router)
    missing, _ = not_sent_to_owner(app)
    assert len(missing) == 2 and all("/hold" in m or "/mute" in m for m in missing), missing


def test_a_call_route_names_its_call_in_the_path_or_the_query() -> None:
    assert CallRoute("/v1/x/{call_id}/y").pattern.match("/v1/x/abc/y").group(1) == "abc"
    assert CallRoute("/v1/x/{call_id}/y").pattern.match("/v1/x/a/b/y") is None
    assert SIDEBAND.pattern.match("/v1/realtime") is not None
    with pytest.raises(ValueError):
        CallRoute("/v1/x")  # names no call
    with pytest.raises(ValueError):
        CallRoute("/v1/x/{call_id}", query="call_id")  # names it twice
