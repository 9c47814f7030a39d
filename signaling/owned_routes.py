"""Every route that names a call, as the modules that register them declare it (CallRoute,
signaling/call_route.py).

The workers' routing (`OWNED_PATHS`) and the cluster's (`CALL_PATHS`) both send a request
whose path matches one of `PATHS` to the owner its call id names. The sideband
(`GET /v1/realtime?call_id=`) is declared in signaling/sideband.py and relays itself.
"""

from __future__ import annotations

import re

from signaling import calls, telephony
from signaling.call_route import CallRoute
from signaling.sip import api as sip_api
from signaling.sip import outbound_api

CALL_ROUTES: tuple[CallRoute, ...] = (calls.CALL_ROUTES + telephony.CALL_ROUTES
                                      + sip_api.CALL_ROUTES + outbound_api.CALL_ROUTES)
# the routes the middlewares route (group 1: the call id), each path once
PATHS: tuple[re.Pattern[str], ...] = tuple(dict.fromkeys(
    route.pattern for route in CALL_ROUTES if not route.relayed_by_handler and not route.query))
