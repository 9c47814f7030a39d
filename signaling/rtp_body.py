"""The fields of a `POST /v1/telephony/rtp` body, read into what agent/telephony/rtp_leg.py takes.

`remote` ("HOST:PORT" or "[V6]:PORT", an IP literal) → `(ip, port)`; `codec` → a
`NarrowbandCodec`; `dtmf_payload_type` → the telephone-event payload type or None. A bad
field raises `CallError` with the field's name as `param` (400, like every other bad body).
"""

from __future__ import annotations

import ipaddress
from typing import Any

from agent.errors import CallError
from agent.telephony.codec import CODECS, NarrowbandCodec, codec_by_name
from agent.telephony.rtp_leg import DYNAMIC_PAYLOAD_TYPES, Address
from agent.telephony.telephone_event import DEFAULT_PAYLOAD_TYPE as DEFAULT_DTMF_PAYLOAD_TYPE


def split_ip_port(text: str) -> tuple[str, int, bool]:
    """ "HOST:PORT" or "[V6]:PORT" with an IP literal → (normalized ip, port, whether a ":"
    was there); ValueError when the host is no IP address or the port no number. The range
    of the port is the caller's to check (a listener may take 0, a remote may not)."""
    host, sep, port_text = text.strip().rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return str(ipaddress.ip_address(host)), int(port_text), bool(sep)


def parse_host_port(text: object, param: str) -> Address:
    """ "HOST:PORT" or "[V6]:PORT" with an IP literal → (normalized ip, port)."""
    if not isinstance(text, str) or not text.strip():
        raise CallError("invalid_address", f"'{param}' must be \"HOST:PORT\"", param=param)
    try:
        ip, port, sep = split_ip_port(text)
    except ValueError:
        raise CallError("invalid_address",
                        f"'{param}' must be an IP address and a port, e.g. 192.0.2.10:4000",
                        param=param) from None
    if not sep or not 1 <= port <= 65535:
        raise CallError("invalid_address", f"'{param}' has no valid port", param=param)
    return ip, port


def dtmf_payload_type_from_request(body: dict[str, Any], codec: NarrowbandCodec) -> int | None:
    """The telephone-event payload type a request asks for: `dtmf_payload_type` (null turns
    DTMF off). Absent: 101 with G.711; off with L16, whose audio takes any dynamic type."""
    if "dtmf_payload_type" not in body:
        return DEFAULT_DTMF_PAYLOAD_TYPE if codec.payload_type is not None else None
    value = body["dtmf_payload_type"]
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value not in DYNAMIC_PAYLOAD_TYPES:
        raise CallError("invalid_payload_type", "'dtmf_payload_type' must be an integer in "
                        "96-127, or null", param="dtmf_payload_type")
    return value


def codec_from_request(name: object) -> NarrowbandCodec:
    codec = codec_by_name(name) if isinstance(name, str) else None
    if codec is None:
        names = ", ".join(c.name for c in CODECS.values())
        raise CallError("unsupported_codec", f"'codec' must be one of {names}", param="codec")
    return codec
