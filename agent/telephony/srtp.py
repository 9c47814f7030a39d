"""SRTP on an RTP leg (RFC 3711): the packet transform, done by libsrtp through `pylibsrtp`.

An RTP leg with `srtp` set protects every packet it sends and unprotects every datagram it
takes from its remote before parsing it. Keys come from the signaling (SDES, RFC 4568:
signaling/sip/sdes.py): the far end's key opens what it sends, the leg's own key seals what
the leg sends. A datagram that fails authentication, is a replay or is not SRTP at all is
dropped and counted (`unprotect_failures`), never parsed or played. libsrtp (the binding
aiortc already installs for DTLS-SRTP) does the cryptography; nothing here but the choice of
profile and the counters.
"""

from __future__ import annotations

from dataclasses import dataclass

import pylibsrtp

# The SDES crypto suites (RFC 4568 §6.2) and the libsrtp profile of each.
SUITES: dict[str, int] = {
    "AES_CM_128_HMAC_SHA1_80": pylibsrtp.Policy.SRTP_PROFILE_AES128_CM_SHA1_80,
    "AES_CM_128_HMAC_SHA1_32": pylibsrtp.Policy.SRTP_PROFILE_AES128_CM_SHA1_32,
}
KEY_BYTES = 16  # AES-128 master key
SALT_BYTES = 14  # master salt
MASTER_BYTES = KEY_BYTES + SALT_BYTES  # what an SDES `inline:` key carries


@dataclass(frozen=True)
class SrtpKeys:
    """One leg's keys: the suite, the far end's master key+salt, and the leg's own."""

    suite: str
    remote_key: bytes = b""
    local_key: bytes = b""

    def __post_init__(self) -> None:
        if self.suite not in SUITES:
            raise ValueError(f"unknown SRTP suite {self.suite!r}")
        for key in (self.remote_key, self.local_key):
            if len(key) != MASTER_BYTES:
                raise ValueError(f"an SRTP master key and salt are {MASTER_BYTES} bytes")


class SrtpTransform:
    """Protect outgoing RTP and unprotect incoming SRTP for one leg."""

    def __init__(self, keys: SrtpKeys) -> None:
        self.keys = keys
        profile = SUITES[keys.suite]
        self._out = pylibsrtp.Session(pylibsrtp.Policy(
            key=keys.local_key, ssrc_type=pylibsrtp.Policy.SSRC_ANY_OUTBOUND,
            srtp_profile=profile))
        self._in = self._inbound(keys.remote_key)
        self.protected = 0
        self.unprotected = 0
        self.unprotect_failures = 0  # failed authentication, replays, not SRTP

    def _inbound(self, key: bytes) -> pylibsrtp.Session:
        return pylibsrtp.Session(pylibsrtp.Policy(
            key=key, ssrc_type=pylibsrtp.Policy.SSRC_ANY_INBOUND,
            srtp_profile=SUITES[self.keys.suite]))

    def rekey_inbound(self, keys: SrtpKeys) -> None:
        """A new offer (re-INVITE/UPDATE) brought another key from the far end."""
        if keys.remote_key != self.keys.remote_key:
            self._in = self._inbound(keys.remote_key)
        self.keys = SrtpKeys(self.keys.suite, keys.remote_key, self.keys.local_key)

    def protect(self, packet: bytes) -> bytes:
        self.protected += 1
        return bytes(self._out.protect(packet))

    def unprotect(self, datagram: bytes) -> bytes | None:
        """The RTP packet inside, or None (counted) when it does not authenticate."""
        if len(datagram) < 12:
            self.unprotect_failures += 1
            return None
        try:
            packet = bytes(self._in.unprotect(datagram))
        except pylibsrtp.Error:
            self.unprotect_failures += 1
            return None
        self.unprotected += 1
        return packet

    def stats(self) -> dict[str, object]:
        return {"suite": self.keys.suite, "protected": self.protected,
                "unprotected": self.unprotected,
                "unprotect_failures": self.unprotect_failures}
