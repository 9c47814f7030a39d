"""Who owns an inbound SIP call while it rings (`--sip-webhook`): the key that may see,
accept, reject and control it.

The owner is the tenant of the trunk's `inbound_key` (trunks file) for a call arriving from
that trunk's proxy address (an IP literal `proxy`), else `--sip-inbound-key`'s. Only that key
or an operator (`--admin-key`) may handle the call; every other key gets the same 404 as for
an unknown call. With neither set the call has no owner and any API key of the server may
handle it (never an ephemeral secret). Once accepted, the call's leg belongs to the owner
(an operator accepting it accepts it for the owner), or, without one, to the accepting key.
"""

from __future__ import annotations

from signaling.auth import Principal
from signaling.sip.config import SipConfig
from signaling.sip.ua import SipCall


def inbound_tenant(call: SipCall, config: SipConfig) -> str | None:
    """The tenant that owns `call` (None: any key of the server)."""
    host = call.flow.remote[0].lower()
    for trunk in config.trunks.values():
        if trunk.inbound_tenant is not None and trunk.proxy.host == host:
            return trunk.inbound_tenant
    return config.inbound_tenant


def may_handle(principal: Principal, call: SipCall, config: SipConfig) -> bool:
    if principal.secret is not None:
        return False
    if principal.operator:
        return True
    owner = inbound_tenant(call, config)
    return owner is None or principal.tenant == owner


def leg_owner(principal: Principal, call: SipCall, config: SipConfig) -> Principal:
    """Whom the accepted call's leg belongs to."""
    owner = inbound_tenant(call, config)
    return principal if owner is None or principal.tenant == owner else Principal(
        "key", tenant=owner)
