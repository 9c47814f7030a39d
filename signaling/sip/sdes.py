"""SDES-SRTP for SIP calls (RFC 4568): `RTP/SAVP` offers with `a=crypto`, answered with a key.

An offer's audio stream over `RTP/SAVP` lists crypto attributes, `a=crypto:TAG SUITE
inline:BASE64[|LIFETIME][|MKI:LEN] [SESSION-PARAMS]`. The agent takes the first one it can
serve: suite `AES_CM_128_HMAC_SHA1_80` or `AES_CM_128_HMAC_SHA1_32`, one key of 30 bytes
(master key and salt), no MKI and no session parameters (each of those changes the packet
format or the key schedule, e.g. `UNENCRYPTED_SRTP`, `KDR`), and answers with the same tag
and suite and a fresh key of its own (`secrets`). No usable line: 488, as before SRTP was
served. The packets themselves are protected by agent/telephony/srtp.py (libsrtp).

`--sip-srtp` decides what is accepted: `off` refuses `RTP/SAVP` (488), `offer` (default)
takes either `RTP/AVP` or `RTP/SAVP` with a usable key, `require` refuses plain `RTP/AVP`
(488) and offers `RTP/SAVP` itself where the agent makes the offer (late offer).

A small parser of our own: the SDP library candidates on PyPI either drop unknown attributes
or do not keep them per media stream, and these are a few lines of RFC 4568's grammar.
"""

from __future__ import annotations

import argparse
import base64
import binascii
import re
import secrets
from dataclasses import dataclass

from agent.telephony.srtp import MASTER_BYTES, SUITES, SrtpKeys
from signaling.sip.sdp import AudioChoice, SdpError

MODES = ("off", "offer", "require")
DEFAULT_MODE = "offer"
PLAIN = "RTP/AVP"
SECURE = "RTP/SAVP"
# The suite the agent offers first when it makes the offer (late offer with `require`).
OFFER_SUITE = "AES_CM_128_HMAC_SHA1_80"

_CRYPTO = re.compile(r"^(\d{1,9})\s+([A-Za-z0-9_]+)\s+(\S+)(?:\s+(.*))?$")


@dataclass(frozen=True)
class Crypto:
    """One `a=crypto` attribute the agent can serve."""

    tag: int
    suite: str
    key: bytes  # master key + salt, 30 bytes

    def line(self) -> str:
        return f"a=crypto:{self.tag} {self.suite} inline:{_inline(self.key)}"


def _inline(key: bytes) -> str:
    return base64.b64encode(key).decode("ascii")


def protos_for(mode: str) -> tuple[str, ...]:
    """The m= protocols an offer's audio may use under `--sip-srtp MODE`."""
    if mode == "off":
        return (PLAIN,)
    if mode == "require":
        return (SECURE,)
    return (PLAIN, SECURE)


def crypto_lines(body: bytes, media_index: int) -> list[str]:
    """The values of the `a=crypto:` attributes of the `media_index`-th m= section."""
    index = -1
    found: list[str] = []
    for line in body.decode("utf-8", "replace").replace("\r\n", "\n").split("\n"):
        if line.startswith("m="):
            index += 1
        elif index == media_index and line.startswith("a=crypto:"):
            found.append(line[len("a=crypto:"):].strip())
    return found


def parse_crypto(value: str) -> Crypto | None:
    """One attribute's value, or None when the agent cannot serve it (see module docstring)."""
    match = _CRYPTO.match(value.strip())
    if match is None:
        return None
    tag_text, suite, key_params, session_params = match.groups()
    if suite not in SUITES or session_params:
        return None
    if ";" in key_params:  # several keys: not served
        return None
    method, _, info = key_params.partition(":")
    if method != "inline":
        return None
    key_text, *rest = info.split("|")
    if any(":" in part for part in rest):  # an MKI
        return None
    try:
        key = base64.b64decode(key_text, validate=True)
    except (binascii.Error, ValueError):
        return None
    if len(key) != MASTER_BYTES:
        return None
    return Crypto(int(tag_text), suite, key)


def new_key() -> bytes:
    return secrets.token_bytes(MASTER_BYTES)


@dataclass(frozen=True)
class SdesAnswer:
    """What an offer's crypto negotiation agreed: the keys and our answer's attribute."""

    keys: SrtpKeys
    line: str


def negotiate(body: bytes, choice: AudioChoice, mode: str,
              local_key: bytes | None = None) -> SdesAnswer | SdpError | None:
    """The SRTP agreement for the chosen stream: None for plain RTP (allowed by `mode`), an
    answer for `RTP/SAVP` with a usable crypto line, else the 488 refusing it. `local_key`
    keeps the agent's key across a re-offer (a re-INVITE or UPDATE of the same call)."""
    if choice.proto.upper() != SECURE:
        if mode == "require":
            return SdpError("srtp_required", "this server takes RTP/SAVP (SRTP) only")
        return None
    if mode == "off":
        return SdpError("srtp_not_served", "RTP/SAVP is not served here (--sip-srtp off)")
    for value in crypto_lines(body, choice.index):
        crypto = parse_crypto(value)
        if crypto is None:
            continue
        key = local_key or new_key()
        keys = SrtpKeys(crypto.suite, remote_key=crypto.key, local_key=key)
        return SdesAnswer(keys, Crypto(crypto.tag, crypto.suite, key).line())
    return SdpError("no_usable_crypto", "no a=crypto line with AES_CM_128_HMAC_SHA1_80 or "
                    "_32, one inline key and no MKI or session parameters")


def offer_line(local_key: bytes, tag: int = 1) -> str:
    """Our own offer's attribute (late offer under `require`)."""
    return Crypto(tag, OFFER_SUITE, local_key).line()


def accept_answer(body: bytes, media_index: int, local_key: bytes) -> SrtpKeys | None:
    """The far end's answer to our SAVP offer: its key, on the suite it chose; None when
    its answer has no crypto line the agent can serve."""
    for value in crypto_lines(body, media_index):
        crypto = parse_crypto(value)
        if crypto is not None:
            return SrtpKeys(crypto.suite, remote_key=crypto.key, local_key=local_key)
    return None


def add_arguments(group: argparse._ActionsContainer) -> None:
    group.add_argument("--sip-srtp", choices=MODES, default=DEFAULT_MODE,
                       help="SDES-SRTP (RTP/SAVP with a=crypto): off refuses it (488), offer "
                       "takes RTP/AVP or RTP/SAVP, require refuses plain RTP/AVP (default "
                       f"{DEFAULT_MODE})")
