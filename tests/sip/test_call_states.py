"""The SIP call states per side, and what `GET /v1/sip/calls/{id}` shows of them."""

from __future__ import annotations

import json

from signaling.sip.outbound import OutboundState
from signaling.sip.outbound_api import INBOUND_STATES
from signaling.sip.transaction import TxState
from signaling.sip.ua import InboundState


def test_an_outbound_call_shows_its_state_as_before() -> None:
    assert [state.value for state in OutboundState] == ["calling", "ringing", "answered", "ended"]
    assert json.dumps({"status": OutboundState.ANSWERED}) == '{"status": "answered"}'


def test_every_inbound_step_has_the_state_get_showed_before() -> None:
    # The agent's 2xx waiting for its ACK and the confirmed call both read "answered".
    shown = {state: INBOUND_STATES.get(state, state) for state in InboundState}
    assert json.loads(json.dumps(shown[InboundState.EARLY])) == "ringing"
    assert shown[InboundState.AWAITING_ACK] == shown[InboundState.CONFIRMED] == "answered"
    assert shown[InboundState.ENDING] == "ending"
    assert json.dumps(shown[InboundState.ENDED]) == '"ended"'


def test_the_transaction_states_keep_the_rfc_names() -> None:
    assert {state.value for state in TxState} == {
        "new", "calling", "trying", "proceeding", "completed", "confirmed", "accepted",
        "terminated"}
