"""Abuse limits of the SIP user agent: an INVITE rate per source address.

**INVITE flood.** Each source address has a token bucket for new INVITEs (not their
retransmissions, which their transaction absorbs): `--sip-invite-rate` tokens a second up to
`--sip-invite-burst`. An INVITE without a token is answered 503 with a Retry-After (the
seconds until the next token), statelessly (no transaction, dialog or task is created for
it); past `REPLY_CAP` such answers to one address within a second the rest are dropped
without a word, so a flood cannot turn the agent into an amplifier. The table of addresses
is an LRU bounded by `--sip-invite-table` entries: an address pushed out starts again with a
full bucket, which only ever errs on the side of serving (buckets.py). One log line a second
at most tells how many were refused and from where.

In-dialog requests from the wrong address are refused by dialog_guard.py.
"""

from __future__ import annotations

import argparse
import logging
import math
from collections import Counter
from dataclasses import dataclass
from enum import Enum

from agent.audio.clock import Clock, MonotonicClock
from agent.logs.log_safe import LogThrottle
from signaling.sip.buckets import BucketTable
from signaling.sip.flag_types import between, whole_from

log = logging.getLogger(__name__)

# A trunk or a proxy brings every call from one address: the defaults let a burst of 40 and
# a steady 10 calls a second through (sipp's 100 calls at 10/s), and nothing like a flood.
DEFAULT_INVITE_RATE = 10.0  # new INVITEs a second per source address
DEFAULT_INVITE_BURST = 40
DEFAULT_TABLE_SIZE = 4096  # source addresses remembered (LRU)
REPLY_CAP = 10  # 503s a second to one address; past that, refused INVITEs are dropped


@dataclass(frozen=True)
class GuardSettings:
    invite_rate: float = DEFAULT_INVITE_RATE  # 0: no limit
    invite_burst: int = DEFAULT_INVITE_BURST
    table_size: int = DEFAULT_TABLE_SIZE
    reply_cap: int = REPLY_CAP


class Verdict(Enum):
    ADMIT = "admit"
    REFUSE = "refuse"  # 503 with Retry-After
    DROP = "drop"  # no answer at all


@dataclass(frozen=True)
class InviteDecision:
    verdict: Verdict
    retry_after: int = 0  # whole seconds, for a REFUSE


class InviteLimiter:
    """Token buckets for new INVITEs, one per source address, in a bounded LRU table."""

    def __init__(self, settings: GuardSettings, clock: Clock | None = None) -> None:
        if settings.invite_rate < 0 or settings.invite_burst < 1 or settings.table_size < 1:
            raise ValueError("the INVITE rate must be >= 0, the burst and table size >= 1")
        self.settings = settings
        self._clock = clock or MonotonicClock()
        self.counters: Counter[str] = Counter()
        self._buckets = BucketTable(settings.invite_rate, settings.invite_burst,
                                    settings.table_size, self._clock, self.counters)
        self._noise = LogThrottle(1.0, self._clock)
        self._refused_since_log: Counter[str] = Counter()

    @property
    def enabled(self) -> bool:
        return self.settings.invite_rate > 0

    def __len__(self) -> int:
        return len(self._buckets)

    def decide(self, address: str) -> InviteDecision:
        if not self.enabled:
            return InviteDecision(Verdict.ADMIT)
        bucket, wait = self._buckets.take(address)
        if not wait:
            return InviteDecision(Verdict.ADMIT)
        now = self._buckets.now()
        if now - bucket.window >= 1.0:
            bucket.window, bucket.refusals = now, 0
        bucket.refusals += 1
        self._refused_since_log[address] += 1
        self._log_refusals()
        if bucket.refusals > self.settings.reply_cap:
            self.counters["invites_dropped"] += 1
            return InviteDecision(Verdict.DROP)
        self.counters["invites_limited"] += 1
        return InviteDecision(Verdict.REFUSE, max(1, math.ceil(wait)))

    def _log_refusals(self) -> None:
        if self._noise.admit() is None:
            return  # counted in _refused_since_log, for the next line
        top = ", ".join(f"{address} ({count})"
                        for address, count in self._refused_since_log.most_common(3))
        total = sum(self._refused_since_log.values())
        self._refused_since_log.clear()
        log.warning("sip: %d new INVITE(s) over --sip-invite-rate %g/s refused since the last "
                    "line, from %s", total, self.settings.invite_rate, top)

    def stats(self) -> dict[str, object]:
        return {"invite_rate": self.settings.invite_rate,
                "invite_burst": self.settings.invite_burst,
                "addresses": len(self._buckets), **self.counters}


# -- flags -------------------------------------------------------------------------------------


def add_arguments(group: argparse._ArgumentGroup) -> None:
    group.add_argument("--sip-invite-rate", type=between(0, 100_000, " per second"),
                       default=DEFAULT_INVITE_RATE,
                       metavar="PER_S",
                       help="new INVITEs a second taken from one source address; more get 503 "
                       f"with Retry-After, and past {REPLY_CAP} refusals a second no answer "
                       f"(0: no limit; default {DEFAULT_INVITE_RATE:g})")
    group.add_argument("--sip-invite-burst", type=whole_from(1), default=DEFAULT_INVITE_BURST,
                       metavar="N", help="INVITEs one address may send at once before "
                       f"--sip-invite-rate applies (default {DEFAULT_INVITE_BURST})")
    group.add_argument("--sip-invite-table", type=whole_from(1), default=DEFAULT_TABLE_SIZE,
                       metavar="N", help="source addresses whose INVITE rate is tracked "
                       f"(least recently seen forgotten first; default {DEFAULT_TABLE_SIZE})")


def settings_from_args(args: argparse.Namespace) -> GuardSettings:
    return GuardSettings(
        invite_rate=getattr(args, "sip_invite_rate", DEFAULT_INVITE_RATE),
        invite_burst=getattr(args, "sip_invite_burst", DEFAULT_INVITE_BURST),
        table_size=getattr(args, "sip_invite_table", DEFAULT_TABLE_SIZE))
