"""With several workers, the limits an operator sets are the server's, not each worker's.

Four limits are counted together in the worker folder (tally.py):
- `--max-sessions`: every worker may hold calls up to the limit, but admits one only while
  all workers together hold fewer (`CallLimit`, the agent's `SharedCapacity`);
- `--max-unauthenticated-per-address`: the connections one address holds unauthenticated,
  on every worker together (the address gate of this process counts there);
- `--max-secrets-per-key`: one key's unused ephemeral secrets, on every worker together;
- `--max-calls-per-key` outside a cluster: one key's calls (call_limit.py), the same way.
"""

from __future__ import annotations

from pathlib import Path

from aiohttp import web

from signaling import address_limit
from signaling.auth import SECRETS_KEY
from signaling.call_limit import KEY_CALL_LIMIT_KEY
from signaling.keys import AGENT_KEY
from signaling.workers.tally import SharedTally, key_of

CALLS = key_of("calls")
ADDRESS_SLOTS = 16384  # addresses one worker holds unauthenticated connections of at once
TENANT_SLOTS = 4096  # keys with unused secrets on one worker at once


class CallLimit:
    """The agent's `SharedCapacity`: the server's `--max-sessions` over every worker."""

    def __init__(self, tally: SharedTally, limit: int) -> None:
        self.tally = tally
        self.limit = limit

    def claim(self, held_here: int) -> bool:
        return self.tally.claim(CALLS, held_here, self.limit) is not False

    def publish(self, held_here: int) -> None:
        self.tally.set_here(CALLS, held_here)

    def full(self) -> bool:
        return self.tally.total(CALLS) >= self.limit


TALLIES_KEY = web.AppKey("worker_tallies", list)


def install(app: web.Application, folder: Path, index: int, count: int) -> None:
    """Count this worker's calls, unauthenticated connections and secrets with the others'."""
    tallies: list[SharedTally] = []

    def tally(name: str, slots: int) -> SharedTally:
        tallies.append(SharedTally(folder / f"{name}.tally", index, count, slots))
        return tallies[-1]

    agent = app[AGENT_KEY]
    # The operator's limit is the server's; a plugin's own limit stays each worker's.
    if agent.settings.max_calls:
        agent.shared_capacity = CallLimit(tally("calls", 1), agent.settings.max_calls)
    addresses = tally("addresses", ADDRESS_SLOTS)
    key_calls = tally("key_calls", TENANT_SLOTS)  # --max-calls-per-key (call_limit.py)
    app[SECRETS_KEY].share(tally("secrets", TENANT_SLOTS), key_of)
    app[TALLIES_KEY] = tallies

    async def share_gate(app: web.Application) -> None:
        # The gate is made with the event loop (slow_clients.guarded_event_loop), after the app.
        if address_limit.GATE is not None:
            address_limit.GATE.share(addresses, key_of)
        key_limit = app.get(KEY_CALL_LIMIT_KEY)  # installed after the workers' routing
        if key_limit is not None:
            key_limit.share(key_calls, key_of)

    async def close(app: web.Application) -> None:
        agent.shared_capacity = None
        if address_limit.GATE is not None:
            address_limit.GATE.share(None, key_of)
        app[SECRETS_KEY].share(None, key_of)
        for each in tallies:
            each.close()

    app.on_startup.append(share_gate)
    app.on_cleanup.append(close)


def refresh(app: web.Application) -> None:
    """Forget this worker's dead secrets, so the others stop counting them; tell them the
    calls each key holds here."""
    app[SECRETS_KEY].prune(app[AGENT_KEY].legs)
    key_limit = app.get(KEY_CALL_LIMIT_KEY)
    if key_limit is not None:
        key_limit.publish()
