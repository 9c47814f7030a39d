"""Flood limits of the SIP user agent for every kind of message: a budget of messages a
second per source address, a cap on live server transactions, and the limits on SIP/TCP and
TLS connections (per address, and a deadline for a message to arrive).

**Message budget.** Each source address has a token bucket that every message it sends
spends one token of, before the message is even parsed: requests of every method (OPTIONS,
REGISTER, MESSAGE, SUBSCRIBE, unknown ones, retransmissions and ACKs included), responses
(stray ones too) and unparseable datagrams. `--sip-message-rate` tokens come back a second,
up to `--sip-message-burst`. A message without a token is dropped without a word: no parse,
no answer, no transaction, so a flood costs the agent the least it can and cannot be turned
into an amplifier; a legitimate sender over UDP sends its request again (Timer E/A) and gets
through once its bucket has refilled. New INVITEs keep their own, much smaller bucket on top
of this one (`--sip-invite-rate`, guard.py): a call costs far more than an OPTIONS, and they
are answered 503 with a Retry-After rather than dropped.

The defaults (200 a second, a burst of 400) carry a trunk or a proxy bringing every call
from one address: a call is about 6 to 10 messages (INVITE, ACK, BYE, their answers to our
requests, a retransmission or two) and `--sip-invite-rate` lets 10 new calls a second in, so
a trunk at that rate sends about 100 a second, and OPTIONS keep-alives a few more. Raise it
with `--sip-invite-rate` for a bigger trunk (about 20 messages a second per call a second).

**Live server transactions.** A non-INVITE server transaction over UDP lives 32 s after
its answer (Timer J absorbs retransmissions), so a rate alone still lets tens of thousands
pile up. `--sip-max-transactions` caps them: a new request that would create one more is
answered 503 with a Retry-After, statelessly (no transaction); past `REPLY_CAP` such answers
a second the rest are dropped. Requests within a live call's dialog (its BYE, re-INVITE,
UPDATE) are exempt, so a flood does not stop calls from ending or changing. A transaction
holds about 7 KiB (its request, answer and timer), so the default 2048 bounds a flood's share
near 14 MiB; legitimate traffic keeps about two per call set up in the last 32 s (its INVITE's
and its BYE's), some 640 at 10 new calls a second, plus probes.

The tables of addresses are LRUs bounded by `--sip-invite-table`: an address pushed out
starts again with a full bucket (a flood from very many addresses then meets the transaction
cap instead). Nothing here is kept per request.

**SIP/TCP and TLS connections.** At most `--sip-tcp-per-address` connections from one IP
address at once (besides the global 1,024), and a connection must deliver a complete message
(or an RFC 5626 keep-alive) within `--sip-header-timeout` of its accept and of the first
byte of each message; else it is closed (transport.py does both).
"""

from __future__ import annotations

import argparse
import logging
import math
from collections import Counter
from dataclasses import dataclass

from agent.audio.clock import Clock, MonotonicClock
from agent.logs.log_safe import LogThrottle
from signaling.sip.buckets import BucketTable
from signaling.sip.flag_types import between, seconds_between, whole_from
from signaling.sip.transport import HEADER_TIMEOUT, TCP_PER_ADDRESS

log = logging.getLogger(__name__)

DEFAULT_MESSAGE_RATE = 200.0  # messages a second per source address
DEFAULT_MESSAGE_BURST = 400
DEFAULT_MAX_TRANSACTIONS = 2048  # live server transactions, all sources together (~7 KiB each)
DEFAULT_TABLE_SIZE = 4096  # source addresses remembered (LRU), as --sip-invite-table
DEFAULT_TCP_PER_ADDRESS = TCP_PER_ADDRESS  # concurrent SIP/TCP+TLS connections, one address
DEFAULT_HEADER_TIMEOUT = HEADER_TIMEOUT  # seconds for a connection's message to arrive whole
REPLY_CAP = 100  # 503s a second for the transaction cap; past that, silence
CAP_RETRY_AFTER = 5  # seconds: Timer J frees a flood's transactions within 32 s


@dataclass(frozen=True)
class BudgetSettings:
    message_rate: float = DEFAULT_MESSAGE_RATE  # 0: no budget
    message_burst: int = DEFAULT_MESSAGE_BURST
    max_transactions: int = DEFAULT_MAX_TRANSACTIONS  # 0: no cap
    table_size: int = DEFAULT_TABLE_SIZE
    reply_cap: int = REPLY_CAP
    tcp_per_address: int = DEFAULT_TCP_PER_ADDRESS
    header_timeout: float = DEFAULT_HEADER_TIMEOUT  # 0: none


class MessageBudget:
    """Token buckets for every message, one per source address, in a bounded LRU table."""

    def __init__(self, settings: BudgetSettings, clock: Clock | None = None) -> None:
        if (settings.message_rate < 0 or settings.message_burst < 1
                or settings.table_size < 1):
            raise ValueError("the message rate must be >= 0, the burst and table size >= 1")
        self.settings = settings
        self._clock = clock or MonotonicClock()
        self.counters: Counter[str] = Counter()
        self._buckets = BucketTable(settings.message_rate, settings.message_burst,
                                    settings.table_size, self._clock, self.counters)
        self._noise = LogThrottle(1.0, self._clock)
        self._dropped_since_log: Counter[str] = Counter()

    def __len__(self) -> int:
        return len(self._buckets)

    def admit(self, address: str) -> bool:
        """Spend one of `address`'s tokens; False (drop the message) when it has none."""
        rate = self.settings.message_rate
        if rate <= 0:
            return True
        _, wait = self._buckets.take(address)
        if not wait:
            return True
        self.counters["messages_dropped"] += 1
        self._dropped_since_log[address] += 1
        if self._noise.admit() is not None:
            top = ", ".join(f"{source} ({count})"
                            for source, count in self._dropped_since_log.most_common(3))
            total = sum(self._dropped_since_log.values())
            self._dropped_since_log.clear()
            log.warning("sip: %d message(s) over --sip-message-rate %g/s dropped since the "
                        "last line, from %s", total, rate, top)
        return False

    def stats(self) -> dict[str, object]:
        return {"message_rate": self.settings.message_rate,
                "message_burst": self.settings.message_burst,
                "addresses": len(self._buckets), **self.counters}


class TransactionCap:
    """The cap on live server transactions: admit, refuse (503 + Retry-After) or drop."""

    def __init__(self, settings: BudgetSettings, clock: Clock | None = None) -> None:
        self.settings = settings
        self._clock = clock or MonotonicClock()
        self._window = -math.inf
        self._replies = 0
        self.counters: Counter[str] = Counter()
        self._noise = LogThrottle(1.0, self._clock)

    def decide(self, live: int) -> str:
        """"admit", "refuse" or "drop" for a request that would be transaction `live` + 1."""
        cap = self.settings.max_transactions
        if cap <= 0 or live < cap:
            return "admit"
        now = self._clock.now()
        if now - self._window >= 1.0:
            self._window, self._replies = now, 0
        self._replies += 1
        held = self._noise.admit()
        if held is not None:
            log.warning("sip: %d live server transactions, the --sip-max-transactions cap: "
                        "new requests refused (%d more since the last line)", live, held)
        if self._replies > self.settings.reply_cap:
            self.counters["over_cap_dropped"] += 1
            return "drop"
        self.counters["over_cap_refused"] += 1
        return "refuse"

    def stats(self) -> dict[str, object]:
        return {"max_transactions": self.settings.max_transactions, **self.counters}


# -- flags -------------------------------------------------------------------------------------


def add_arguments(group: argparse._ArgumentGroup) -> None:
    group.add_argument("--sip-message-rate", type=between(0, 1_000_000, " per second"),
                       default=DEFAULT_MESSAGE_RATE,
                       metavar="PER_S",
                       help="SIP messages a second taken from one source address, every "
                       "method and response counted; more are dropped unanswered (0: no "
                       f"limit; default {DEFAULT_MESSAGE_RATE:g}, enough for a trunk at "
                       "--sip-invite-rate)")
    group.add_argument("--sip-message-burst", type=whole_from(1), default=DEFAULT_MESSAGE_BURST,
                       metavar="N", help="messages one address may send at once before "
                       f"--sip-message-rate applies (default {DEFAULT_MESSAGE_BURST})")
    group.add_argument("--sip-max-transactions", type=whole_from(0),
                       default=DEFAULT_MAX_TRANSACTIONS, metavar="N",
                       help="live SIP server transactions at most; a new request beyond "
                       "gets 503 with Retry-After, except within a live call (0: no cap; "
                       f"default {DEFAULT_MAX_TRANSACTIONS})")
    group.add_argument("--sip-tcp-per-address", type=whole_from(1),
                       default=DEFAULT_TCP_PER_ADDRESS, metavar="N",
                       help="concurrent SIP/TCP and TLS connections from one IP address; "
                       f"more are closed at once (default {DEFAULT_TCP_PER_ADDRESS})")
    group.add_argument("--sip-header-timeout", type=seconds_between(0, 3600),
                       default=DEFAULT_HEADER_TIMEOUT,
                       metavar="S", help="close a SIP/TCP or TLS connection whose message "
                       "has not arrived whole S seconds after its accept or its first byte "
                       f"(0: never; default {DEFAULT_HEADER_TIMEOUT:g})")


def settings_from_args(args: argparse.Namespace) -> BudgetSettings:
    return BudgetSettings(
        message_rate=getattr(args, "sip_message_rate", DEFAULT_MESSAGE_RATE),
        message_burst=getattr(args, "sip_message_burst", DEFAULT_MESSAGE_BURST),
        max_transactions=getattr(args, "sip_max_transactions", DEFAULT_MAX_TRANSACTIONS),
        table_size=getattr(args, "sip_invite_table", DEFAULT_TABLE_SIZE),
        tcp_per_address=getattr(args, "sip_tcp_per_address", DEFAULT_TCP_PER_ADDRESS),
        header_timeout=getattr(args, "sip_header_timeout", DEFAULT_HEADER_TIMEOUT))
