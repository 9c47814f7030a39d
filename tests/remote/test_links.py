"""Both remote plugins against fake engines, driven like the ticker drives them (no WebRTC):
the protocol, exact re-framing, text, errors for every kind of upstream misbehaviour, and no
task or engine session left behind."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from agent.plugins.base import PluginError, SessionConfig
from agent.plugins.remote.link import LinkSettings
from agent.plugins.remote.moshi_server import MoshiServerPlugin
from agent.plugins.remote.plugin import RemotePlugin
from agent.plugins.remote.pool import UpstreamPool
from agent.plugins.remote.vllm_omni import VllmOmniPlugin
from tests.support.agents import wait_until
from tests.support.fake_engines import Behaviour, FakeServer

from .conftest import StartFake
from .driver import FRAME, Driver, failed_with, loud, upstream_tasks

FAST = LinkSettings(connect_timeout=2.0, handshake_timeout=2.0, stall_timeout=0.6)
PLUGINS: dict[str, type[RemotePlugin]] = {"vllm": VllmOmniPlugin, "moshi": MoshiServerPlugin}


def tone(seconds: float) -> np.ndarray:
    t = np.arange(int(seconds * 24000)) / 24000
    return (0.3 * np.sin(2 * np.pi * 440 * t) * (1 + 0.5 * np.sin(2 * np.pi * 3 * t)) / 1.5
            ).astype(np.float32)


async def finish(driver: Driver, fakes: list[FakeServer]) -> None:
    """Shut the plugin down and check nothing is left: no tasks, no open engine sessions."""
    await driver.shutdown()
    assert upstream_tasks() == []
    await wait_until(lambda: all(f.active == 0 for f in fakes), timeout=5)


@pytest.mark.parametrize("ga_names", [False, True], ids=["vllm-omni names", "GA names"])
async def test_vllm_omni_audio_comes_back_exactly_reframed_with_text(
    start_fake: StartFake, ga_names: bool,
) -> None:
    fake = await start_fake("vllm", Behaviour(ga_names=ga_names))
    plugin = VllmOmniPlugin([fake.url], model="personaplex-7b", voice="NATF2.pt",
                            settings=FAST)
    driver = Driver(plugin)
    session = await driver.open(SessionConfig(instructions="You are a helpful agent."))
    signal = tone(2.0)
    outputs = await driver.run_until(
        session, lambda outs: sum(loud(o) for o in outs) >= 20, signal=signal
    )
    config = fake.sessions[0].config
    assert config["model"] == "personaplex-7b" and config["voice"] == "NATF2.pt"
    assert config["instructions"] == "You are a helpful agent."
    assert config["turn_detection"] is None and config["extra_body"] == {"auto_response": True}
    assert all(o.audio.shape == (FRAME,) and o.audio.dtype == np.float32 for o in outputs)
    # The echo comes back sample-exact (to pcm16 precision) despite odd-sized deltas.
    # (Frames that were not complete in time came out as silence: skip those underruns.)
    played = np.concatenate([o.audio for o in outputs if loud(o)][:20])
    np.testing.assert_allclose(played, signal[: len(played)], atol=2 / 32768)
    text = "".join(o.text for o in outputs)
    assert text.startswith("word1 word2 word3 ")
    assert any(o.segment_end for o in outputs)
    stats = session.stats()
    assert stats["upstream_session_id"] == fake.sessions[0].id
    assert stats["latency"]["upstream_rtt"]["count"] >= 19
    assert stats["server_event_seq_anomalies"] == 0 and stats["last_server_event_seq"] > 40
    await driver.close(session)
    await wait_until(lambda: fake.sessions[0].closed_by_client)
    assert fake.violations == []
    await finish(driver, [fake])


async def test_moshi_server_audio_and_text_pieces_round_trip(start_fake: StartFake) -> None:
    fake = await start_fake("moshi", Behaviour(handshake_delay=0.3))
    plugin = MoshiServerPlugin([fake.url], voice="NATM1.pt", settings=FAST)
    driver = Driver(plugin)
    session = await driver.open(SessionConfig(instructions="Talk like a pirate."))
    assert fake.sessions[0].query == {"voice_prompt": "NATM1.pt",
                                      "text_prompt": "Talk like a pirate."}
    signal = tone(3.0)
    outputs = await driver.run_until(
        session, lambda outs: sum(loud(o) for o in outs) >= 20, signal=signal
    )
    # What the engine decoded is the caller's tone (Opus is lossy: compare by correlation).
    heard = np.concatenate(fake.sessions[0].samples_in)[: 24000]
    lag = int(np.argmax(np.correlate(signal[:12000], heard[2000:8000], "valid")))
    segment = signal[lag : lag + 6000]
    assert np.corrcoef(heard[2000:8000], segment)[0, 1] > 0.9
    played = np.concatenate([o.audio for o in outputs])
    assert np.sqrt(np.mean(played[-FRAME * 10 :] ** 2)) > 0.05
    assert "".join(o.text for o in outputs).startswith(" word1 word2")
    assert session.stats()["latency"]["upstream_rtt"]["count"] >= 15
    await driver.close(session)
    assert fake.violations == []
    await finish(driver, [fake])


@pytest.mark.parametrize(
    ("kind", "misbehave", "code"),
    [
        ("vllm", "garbage", "upstream_protocol_error"),
        ("vllm", "wrong_format", "upstream_format_unsupported"),
        ("vllm", "silent", "upstream_stalled"),
        ("vllm", "close", "upstream_closed"),
        ("vllm", "expire", "upstream_session_closed"),
        ("moshi", "garbage", "upstream_bad_audio"),
        ("moshi", "wrong_format", "upstream_bad_audio"),
        ("moshi", "unknown_kind", "upstream_protocol_error"),
        ("moshi", "silent", "upstream_stalled"),
        ("moshi", "close", "upstream_closed"),
    ],
)
async def test_upstream_misbehaviour_ends_the_session_with_a_clear_error(
    start_fake: StartFake, kind: str, misbehave: str, code: str,
) -> None:
    fake = await start_fake(kind, Behaviour(misbehave=misbehave, after_frames=6))
    driver = Driver(PLUGINS[kind]([fake.url], settings=FAST))
    session = await driver.open()
    outputs = await driver.run_until(session, lambda outs: failed_with(outs) is not None,
                                     signal=tone(2.0))
    failure = failed_with(outputs)
    assert failure is not None and failure.error is not None
    assert failure.error.code == code, failure.error.message
    assert failure.error.message
    # Exactly one error per session; afterwards only silence.
    after = [await driver.step(session, np.zeros(FRAME, np.float32)) for _ in range(3)]
    assert all(o.error is None and not o.end_call and not loud(o) for o in after)
    assert session.stats()["error"] == code
    # One bad session (or a clean close) does not put the server itself in backoff.
    assert driver.plugin.pool.upstreams[0].failures == 0
    await driver.close(session)
    await finish(driver, [fake])


async def test_vllm_error_event_mid_call_is_reported_and_the_call_goes_on(
    start_fake: StartFake,
) -> None:
    fake = await start_fake("vllm", Behaviour(misbehave="error_event", after_frames=4))
    driver = Driver(VllmOmniPlugin([fake.url], settings=FAST))
    session = await driver.open()
    outputs = await driver.run_until(
        session, lambda outs: any(o.error for o in outs) and sum(loud(o) for o in outs) >= 10,
        signal=tone(2.0),
    )
    notice = next(o.error for o in outputs if o.error)
    assert notice is not None and notice.code == "invalid_audio_chunk"
    assert not any(o.end_call for o in outputs)
    await driver.close(session)
    await finish(driver, [fake])


@pytest.mark.parametrize("kind", ["vllm", "moshi"])
async def test_slow_handshake_is_a_503_and_the_engine_socket_is_closed(
    start_fake: StartFake, kind: str,
) -> None:
    fake = await start_fake(kind, Behaviour(handshake_delay=3.0))
    settings = LinkSettings(handshake_timeout=0.3)
    driver = Driver(PLUGINS[kind]([fake.url], settings=settings))
    with pytest.raises(PluginError) as refused:
        await driver.open()
    assert refused.value.status == 503
    upstream = driver.plugin.pool.describe()[0]
    assert upstream["healthy"] is False  # skipped for a while either way
    if kind == "vllm":
        assert refused.value.code == "upstream_handshake_timeout"
        assert upstream["failures"] == 1
    else:
        # A reference server that does not answer holds someone else's conversation behind
        # its lock: busy, not broken, so it is not counted as a failure.
        assert refused.value.code == "upstream_busy"
        assert upstream["failures"] == 0 and upstream["last_error"] == "full"
    await finish(driver, [fake])


@pytest.mark.parametrize("kind", ["vllm", "moshi"])
async def test_engine_at_capacity_refuses_the_offer_with_503(
    start_fake: StartFake, kind: str,
) -> None:
    fake = await start_fake(kind, Behaviour(capacity=1))
    # The agent does not know the engine's capacity (0 = unlimited): the engine says it.
    driver = Driver(PLUGINS[kind]([fake.url], capacity=0, settings=FAST))
    first = await driver.open()
    with pytest.raises(PluginError) as refused:
        await driver.open()
    assert refused.value.status == 503
    assert refused.value.code == {"vllm": "resource_exhausted", "moshi": "upstream_busy"}[kind]
    assert fake.refused == 1
    await driver.close(first)
    await finish(driver, [fake])


async def test_unreachable_upstream_is_skipped_for_a_reachable_one(
    start_fake: StartFake,
) -> None:
    fake = await start_fake("vllm")
    dead = await start_fake("vllm")
    dead_url = dead.url
    await dead.close()
    driver = Driver(VllmOmniPlugin([dead_url, fake.url], settings=FAST))
    sessions = [await driver.open() for _ in range(2)]
    assert [s.link.lease.url for s in sessions] == [fake.url, fake.url]
    health = driver.plugin.health()["upstreams"]
    assert health[0]["healthy"] is False and health[0]["last_error"] == "upstream_unreachable"
    for session in sessions:
        await driver.close(session)
    await finish(driver, [fake])


async def test_nothing_reachable_is_a_503(start_fake: StartFake) -> None:
    dead = await start_fake("moshi")
    dead_url = dead.url
    await dead.close()
    driver = Driver(MoshiServerPlugin([dead_url], settings=FAST))
    with pytest.raises(PluginError) as refused:
        await driver.open()
    assert refused.value.status == 503 and refused.value.code == "upstream_unreachable"
    with pytest.raises(PluginError) as again:  # now in backoff: not even tried
        await driver.open()
    assert again.value.code == "upstreams_unavailable"
    await finish(driver, [])


async def test_an_engine_session_nobody_claims_is_closed(start_fake: StartFake) -> None:
    fake = await start_fake("vllm")
    plugin = VllmOmniPlugin([fake.url], settings=FAST, claim_timeout=0.2)
    driver = Driver(plugin)
    runtime = await plugin.prepare_runtime_config(SessionConfig())
    await wait_until(lambda: fake.active == 0, timeout=5)
    assert plugin.pool.upstreams[0].active == 0
    with pytest.raises(PluginError) as refused:
        plugin.create_session(runtime)
    assert refused.value.code == "upstream_session_expired"
    await finish(driver, [fake])


async def test_client_extra_body_is_refused_before_any_engine_is_used(
    start_fake: StartFake,
) -> None:
    fake = await start_fake("vllm")
    driver = Driver(VllmOmniPlugin([fake.url], settings=FAST))
    with pytest.raises(PluginError) as refused:
        await driver.open(SessionConfig(extra_body={"temperature": 2}))
    assert refused.value.code == "unknown_option"
    # Validating a config (minting a client secret) reserves no engine session either.
    await driver.plugin.validate_session_config(SessionConfig(voice="NATF2.pt"))
    assert fake.sessions == [] and driver.plugin.pool.upstreams[0].active == 0
    await finish(driver, [fake])


async def test_the_engine_is_not_called_stalled_while_the_call_is_still_connecting(
    start_fake: StartFake,
) -> None:
    fake = await start_fake("vllm")
    driver = Driver(VllmOmniPlugin([fake.url], settings=FAST))
    session = await driver.open()
    await asyncio.sleep(FAST.stall_timeout * 1.5)  # ICE/DTLS before the first frame
    outputs = await driver.run_until(session, lambda outs: sum(loud(o) for o in outs) >= 5,
                                     signal=tone(1.0))
    assert not any(o.error for o in outputs)
    await driver.close(session)
    await finish(driver, [fake])


@pytest.mark.parametrize("kind", ["vllm", "moshi"])
async def test_a_server_holding_the_upgrade_is_warming_not_failed(
    start_fake: StartFake, kind: str
) -> None:
    fake = await start_fake(kind, Behaviour(warming_up=True))
    settings = LinkSettings(connect_timeout=0.3, handshake_timeout=2.0, stall_timeout=0.6)
    pool = UpstreamPool([fake.url], 0, warmup_seconds=120.0, warming_retry_seconds=0.5)
    driver = Driver(PLUGINS[kind]([fake.url], settings=settings, pool=pool))
    with pytest.raises(PluginError) as refused:
        await driver.open()
    assert refused.value.status == 503 and refused.value.code == "upstream_warming_up"
    with pytest.raises(PluginError) as again:  # within the retry interval: not even tried
        await driver.open()
    assert again.value.code == "upstreams_warming_up"
    upstream = driver.plugin.health()["upstreams"][0]
    assert upstream["failures"] == 0 and upstream["warming_for_s"] is not None
    fake.warm.set()
    await asyncio.sleep(0.55)
    session = await driver.open()
    assert driver.plugin.health()["upstreams"][0]["warming_for_s"] is None
    await driver.close(session)
    await finish(driver, [fake])
