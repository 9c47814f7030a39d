"""The real Kyutai Moshi server (`moshi==0.2.13` from PyPI, on the CPU with a tiny random
checkpoint our generator writes) behind `--plugin moshi-server --upstream-kind kyutai`."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import numpy as np
import pytest

from agent.plugins.base import PluginOptions
from agent.plugins.personaplex.tiny_checkpoint import write_checkpoint
from agent.plugins.remote.moshi_server import MoshiServerPlugin
from agent.testing.peer import run_call
from tests.support.agents import AgentFactory, all_freed, wait_until
from tests.support.oracles import require as require_oracle
from tests.support.realtime import RealtimeClient

pytestmark = [pytest.mark.interop, pytest.mark.model]

LAUNCHER = Path(__file__).with_name("cpu_moshi_server.py")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture
async def moshi_server(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[str]:
    require_oracle("moshi.models.lm")  # moshi==0.2.13 (its server module parses argv on import)
    checkpoint = write_checkpoint(tmp_path_factory.mktemp("kyutai") / "tiny", "tiny", "moshi",
                                  seed=1)
    # Kyutai's loader looks `mimi_config_name` up on the hub unless it is a file:// path.
    config = json.loads((checkpoint / "config.json").read_text())
    config["mimi_config_name"] = "file://" + str(checkpoint / config["mimi_config_name"])
    (checkpoint / "config.json").write_text(json.dumps(config))
    port = free_port()
    server = await asyncio.create_subprocess_exec(
        sys.executable, str(LAUNCHER), "--host", "127.0.0.1", "--port", str(port),
        "--device", "cpu", "--static", "none", "--config-path", str(checkpoint / "config.json"),
        "--moshi-weight", str(checkpoint / "model.safetensors"),
        "--mimi-weight", str(checkpoint / "tokenizer-e351c8d8-checkpoint125.safetensors"),
        "--tokenizer", str(checkpoint / "tokenizer_spm_32k_3.model"),
        env={**os.environ, "HF_HUB_OFFLINE": "1", "NO_TORCH_COMPILE": "1"},
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )
    assert server.stdout is not None
    seen = []
    try:
        async def ready() -> None:
            while True:
                line = (await server.stdout.readline()).decode(errors="replace")
                if not line:
                    raise AssertionError("moshi.server exited: " + "".join(seen[-20:]))
                seen.append(line)
                if "Running on" in line:
                    return
        await asyncio.wait_for(ready(), 240)
        yield f"ws://127.0.0.1:{port}/api/chat"
    finally:
        server.kill()
        await server.wait()


async def second_offer(base_url: str) -> tuple[int, str, str | None, float]:
    client = RealtimeClient(base_url)
    try:
        sdp = await client.offer_sdp()
        began = time.perf_counter()
        async with aiohttp.ClientSession() as http:
            response = await client.post(http, sdp)
            async with response:
                body = await response.json()
                return (response.status, body["error"]["code"],
                        response.headers.get("Retry-After"), time.perf_counter() - began)
    finally:
        await client.close()


@pytest.mark.slow
async def test_a_call_gets_model_audio_and_text_from_the_real_moshi_server(
    moshi_server: str, start_agent: AgentFactory,
) -> None:
    plugin = MoshiServerPlugin.from_options(PluginOptions(
        upstreams=(moshi_server,), extra={"upstream_kind": "kyutai"}))
    running = await start_agent(plugin)
    call = asyncio.ensure_future(run_call(running.url, seconds=5.0))
    await wait_until(lambda: any(c.connected_at for c in running.agent.webrtc_legs.values()), 60)
    # The reference server holds one conversation: a second caller is refused at once
    # (capacity 1 by default for reference servers, so the agent is full), and that says
    # nothing bad about the server.
    status, code, retry_after, seconds = await second_offer(running.url)
    print(f"second caller refused in {seconds * 1000:.0f} ms: {status} {code}")
    assert (status, code, retry_after) == (503, "server_full", "5")  # the pool holds 1
    assert seconds < 2.0
    report, _, received = await call
    assert plugin.pool.upstreams[0].failures_total == 0
    assert report.ok, report.error
    assert report.seconds_received > 4.0
    assert float(np.sqrt(np.mean(received[48000:] ** 2))) > 1e-3  # model audio, not silence
    assert report.transcript.strip(), report  # text pieces came back
    assert "<s>" not in report.transcript
    assert report.max_gap_ms <= 120, report  # no holes after the first second
    await wait_until(lambda: all_freed(running), timeout=15)
