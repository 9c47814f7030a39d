"""What a key may dial, and how fast (docs/sip.md, "Outbound limits"): so a leaked tenant key
cannot become toll fraud.

- `Destinations`: a trunk's `allow` list (trunks file): patterns of the numbers or URIs its
  calls may reach. A pattern without a scheme (`+1415*`, `1800???????`) is matched against
  the target's user part, %-unescaped; one with a scheme (`sip:*@pbx.example.com`) against
  `scheme:user@host[:port]`, the host case-insensitively. `*` is any run of characters, `?`
  one character; everything else is literal. No `allow`: any destination.
- `OutboundRate`: per key, calls placed per second (`--sip-outbound-rate`, a token bucket
  with `--sip-outbound-burst`); beyond it 429 `sip_outbound_rate` with `Retry-After`.
- `safe_text`: user-supplied text that goes into a SIP header (a display name, a header
  value): no line break, NUL or other control character (C0, DEL, C1, U+2028/U+2029).
"""

from __future__ import annotations

import argparse
import math
import re
import unicodedata
from dataclasses import dataclass
from urllib.parse import unquote

from agent.audio.clock import Clock
from signaling.sip.buckets import BucketTable
from signaling.sip.flag_types import between
from signaling.sip.uri import Uri, format_host

DEFAULT_RATE = 2.0  # calls a second, per key: a small call centre's dialler
DEFAULT_BURST = 10
MAX_PATTERNS = 1000
MAX_PATTERN_CHARS = 256
MAX_KEYS = 100_000  # buckets kept (keys are configured, so far fewer in practice)
UNSAFE = re.compile(r"[\x00-\x08\x0a-\x1f\x7f-\x9f\u2028\u2029]")


def safe_text(text: str) -> bool:
    """`text` may go into a SIP header: no line break or control character, no unassigned
    or private-use code point."""
    return not UNSAFE.search(text) and all(
        unicodedata.category(char) not in ("Cn", "Co", "Cs") for char in text if char > "\x7f")


def _compile(pattern: str) -> re.Pattern[str]:
    parts = (".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern)
    return re.compile("".join(parts), re.DOTALL)


@dataclass(frozen=True)
class Destinations:
    """A trunk's `allow` list (empty: anything)."""

    patterns: tuple[str, ...] = ()

    @classmethod
    def parse(cls, value: object, where: str) -> Destinations:
        """ValueError (with `where`) for anything but a list of short one-line strings."""
        if value is None:
            return cls()
        if not isinstance(value, list) or not value or len(value) > MAX_PATTERNS or not all(
                isinstance(p, str) and p and len(p) <= MAX_PATTERN_CHARS and safe_text(p)
                and p.isascii() for p in value):
            raise ValueError(f"{where}: 'allow' must be a non-empty list of at most "
                             f"{MAX_PATTERNS} patterns such as \"+1415*\" or "
                             "\"sip:*@pbx.example.com\" (ASCII, one line each)")
        return cls(tuple(value))

    def permits(self, target: Uri) -> bool:
        if not self.patterns:
            return True
        try:
            user = unquote(target.user or "", errors="strict")
        except UnicodeDecodeError:
            return False  # %-escapes that are not UTF-8 match no pattern
        port = f":{target.port}" if target.port else ""
        whole = f"{target.scheme}:{user + '@' if user else ''}{format_host(target.host)}{port}"
        for pattern in self.patterns:
            if ":" in pattern.split("@", 1)[0]:  # a scheme: the whole URI
                if _compile(pattern.lower()).fullmatch(whole.lower()):
                    return True
            elif user and _compile(pattern).fullmatch(user):
                return True
        return False


class OutboundRate:
    """One token bucket per key: `rate` calls a second, `burst` at once (rate 0: off)."""

    def __init__(self, rate: float = DEFAULT_RATE, burst: int = DEFAULT_BURST,
                 clock: Clock | None = None) -> None:
        self.rate, self.burst = rate, max(1, burst)
        self._buckets = BucketTable(rate, self.burst, MAX_KEYS, clock)
        self.refused = 0

    def take(self, key: str) -> float:
        """0.0 when a call may be placed now (its token taken), else the seconds until one
        may."""
        if self.rate <= 0:
            return 0.0
        _, wait = self._buckets.take(key)
        self.refused += bool(wait)
        return wait

    @staticmethod
    def retry_after(wait: float) -> str:
        return str(max(1, math.ceil(wait)))


def add_arguments(group: argparse._ArgumentGroup) -> None:
    group.add_argument("--sip-outbound-rate", type=between(0, 10_000), default=DEFAULT_RATE,
                       metavar="R",
                       help="outbound calls (POST /v1/sip/calls) one API key may place per "
                       f"second on this node; more get 429 sip_outbound_rate (default "
                       f"{DEFAULT_RATE:g}; 0: no limit)")
    group.add_argument("--sip-outbound-burst", type=int, default=DEFAULT_BURST, metavar="N",
                       help="outbound calls one key may place at once before the rate "
                       f"applies (default {DEFAULT_BURST})")
    group.add_argument("--sip-inbound-key", default=None, metavar="KEY",
                       help="with --sip-webhook, the API key (one of --api-key) that owns the "
                       "calls arriving on the SIP listener: only it (or an --admin-key) may "
                       "see, accept, reject or control them (default: any API key of the "
                       "server; a trunk's inbound_key in --sip-trunks overrides it)")
