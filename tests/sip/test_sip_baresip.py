"""baresip, a real softphone, calls the agent: it plays the test signal from a WAV, records
what it hears (its sndfile module), and the echo of the echo plugin must correlate with what
it sent (>= 0.9) in G.722 (baresip's own G.722, spandsp's: not the FFmpeg one the agent
uses), L16/16000 and PCMU. Keys pressed on it (`sndcode` over its ctrl_tcp socket) reach the
call's sideband websocket (`GET /v1/realtime?call_id=`) as
`input_audio_buffer.dtmf_event_received` events.

baresip runs headless on 127.0.0.1 with the configuration docs/sip.md gives to copy,
examples/baresip/config and accounts (aufile source, aubridge player, sndfile recorder),
changed only where a test must (fresh ports, its own WAV and folder, the codec it offers),
with `-t` as its own time bound, and is stopped by its PID. Without baresip these tests skip
(and fail under CI).
"""

from __future__ import annotations

import asyncio
import json
import shutil
import wave
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import aiohttp
import numpy as np
import pytest

from agent.testing.testsignal import make_test_signal, measure_echo
from tests.sip.helpers import HOST, SipServer, free_udp_port, missing, stop_process
from tests.support.agents import wait_until
from tests.support.server_process import free_tcp_port

pytestmark = [pytest.mark.interop, pytest.mark.slow]

MODULES = "/usr/lib/baresip/modules"
SECONDS = 4.0


def require_baresip() -> str:
    path = shutil.which("baresip")
    if path is not None and Path(MODULES, "g722.so").exists():
        return path
    missing("baresip is missing (apt-get install baresip-core; scripts/install-test-deps.sh)")


def write_wav(path: Path, samples: np.ndarray, rate: int) -> None:
    with wave.open(str(path), "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(rate)
        out.writeframes((samples * 32767).astype("<i2").tobytes())


def read_wav(path: Path) -> tuple[np.ndarray, int]:
    with wave.open(str(path), "rb") as source:
        data = source.readframes(source.getnframes())
        return np.frombuffer(data, "<i2").astype(np.float32) / 32768, source.getframerate()


class Baresip:
    """A headless baresip and its ctrl_tcp socket (JSON in netstrings)."""

    def __init__(self, process: asyncio.subprocess.Process, reader: asyncio.StreamReader,
                 writer: asyncio.StreamWriter, records: Path) -> None:
        self.process, self.reader, self.writer, self.records = process, reader, writer, records
        self.events: list[dict[str, object]] = []
        self._buffer = b""

    async def command(self, command: str, params: str = "") -> None:
        body = json.dumps({"command": command, "params": params, "token": command}).encode()
        self.writer.write(f"{len(body)}:".encode() + body + b",")
        await self.writer.drain()

    async def event(self, kind: str, timeout: float = 15.0) -> dict[str, object]:
        """The next event of this type (`CALL_ESTABLISHED`, `CALL_CLOSED`...)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            while b":" in self._buffer:
                size_text, _, rest = self._buffer.partition(b":")
                size = int(size_text)
                if len(rest) < size + 1:
                    break
                message = json.loads(rest[:size])
                self._buffer = rest[size + 1:]
                self.events.append(message)
                if message.get("event") and message.get("type") == kind:
                    return message
            data = await asyncio.wait_for(self.reader.read(4096),
                                          max(0.01, deadline - loop.time()))
            if not data:
                raise AssertionError(f"baresip closed its control socket before {kind}: "
                                     f"{self.events}")
            self._buffer += data

    def recording(self, which: str) -> Path:
        (path,) = self.records.glob(f"dump-*-{which}.wav")
        return path


EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "baresip"
EXAMPLE_ACCOUNT = "sip:me@127.0.0.1:5062"


def configured(text: str, values: dict[str, str]) -> str:
    """The example config with each key of `values` set (every one must be in it: a test
    changes only what the example has) and `module` lines for the modules it lacks."""
    lines = text.splitlines()
    seen: set[str] = set()
    for index, line in enumerate(lines):
        key = line.split(None, 1)[0] if line.strip() else ""
        if key in values and key != "module":
            lines[index] = f"{key}\t\t{values[key]}"
            seen.add(key)
    assert seen == set(values) - {"module"}, f"not in examples/baresip/config: " \
        f"{set(values) - seen - {'module'}}"
    modules = [index for index, line in enumerate(lines) if line.startswith("module\t")]
    loaded = {lines[index].split()[1] for index in modules}
    lines[modules[-1] + 1:modules[-1] + 1] = [
        f"module\t\t\t{name}" for name in values.get("module", "").split() if name not in loaded]
    return "\n".join(lines) + "\n"


def account_line(user: str, port: int, params: str) -> str:
    """The example's account as `user` on `port`, its `audio_codecs` replaced by `params`."""
    (line,) = [line for line in (EXAMPLE / "accounts").read_text().splitlines()
               if line.startswith("<")]
    assert EXAMPLE_ACCOUNT in line, line
    kept = [part for part in line.split(";")[1:] if not part.startswith("audio_codecs=")]
    uri = line.split(";")[0].replace(EXAMPLE_ACCOUNT, f"sip:{user}@{HOST}:{port}")
    return ";".join([uri, *kept, *([params] if params else [])])


def write_config(workdir: Path, wav: Path, rate: int, modules: list[str], user: str,
                 account: str) -> tuple[int, int]:
    """examples/baresip's `config` and `accounts` in workdir/baresip, on fresh loopback
    ports: headless (`aubridge` plays nothing), `wav` as its microphone at `rate`, `modules`
    loaded besides the example's, what it hears recorded in workdir/records, one account
    `user` with the parameters `account` ("audio_codecs=..."). Returns (SIP port, ctrl_tcp
    port)."""
    config, records = workdir / "baresip", workdir / "records"
    config.mkdir(parents=True, exist_ok=True)
    records.mkdir(exist_ok=True)
    sip_port, ctrl_port = free_udp_port(), free_tcp_port()
    (config / "config").write_text(configured((EXAMPLE / "config").read_text(), {
        "sip_listen": f"{HOST}:{sip_port}", "net_interface": HOST,
        "audio_source": f"aufile,{wav}", "ausrc_srate": str(rate), "auplay_srate": str(rate),
        "module_path": MODULES, "ctrl_tcp_listen": f"{HOST}:{ctrl_port}",
        "snd_path": str(records), "module": " ".join(f"{name}.so" for name in modules)}))
    (config / "accounts").write_text(account_line(user, sip_port, account) + "\n")
    return sip_port, ctrl_port


@asynccontextmanager
async def baresip(workdir: Path, wav: Path, rate: int, codec: str,
                  extra_modules: tuple[str, ...] = (),
                  account_params: str = "") -> AsyncIterator[Baresip]:
    """baresip with `wav` as its microphone and only `codec` (e.g. "G722/16000/1");
    `extra_modules` loaded too, `account_params` added to its account (";mediaenc=...")."""
    binary = require_baresip()
    config, records = workdir / "baresip", workdir / "records"
    ctrl_port = write_config(
        workdir, wav, rate, ["g711", "g722", "l16", "aufile", "aubridge", "sndfile",
                             *extra_modules],
        "caller", f"audio_codecs={codec}{account_params}")[1]
    process = await asyncio.create_subprocess_exec(
        binary, "-f", str(config), "-t", "40", stdin=asyncio.subprocess.DEVNULL,
        stdout=(workdir / "baresip.log").open("wb"), stderr=asyncio.subprocess.STDOUT)
    writer: asyncio.StreamWriter | None = None
    try:
        for _ in range(100):
            try:
                reader, writer = await asyncio.open_connection(HOST, ctrl_port)
                break
            except OSError:
                await asyncio.sleep(0.1)
        else:
            raise AssertionError("baresip's ctrl_tcp never listened: "
                                 + (workdir / "baresip.log").read_text(errors="replace"))
        yield Baresip(process, reader, writer, records)
    finally:
        if writer is not None:
            writer.close()
        await stop_process(process)


async def dtmf_events(sideband: aiohttp.ClientWebSocketResponse, count: int) -> list[str]:
    """The digits of the next `count` dtmf_event_received events on a sideband."""
    digits: list[str] = []
    while len(digits) < count:
        message = await sideband.receive(timeout=10)
        assert message.type == aiohttp.WSMsgType.TEXT, message
        event = json.loads(message.data)
        if event["type"] == "input_audio_buffer.dtmf_event_received":
            digits.append(event["event"])
    return digits


@pytest.mark.parametrize("codec, rate, agent_codec", [
    ("G722/16000/1", 16000, "G722"),
    ("L16/16000/1", 16000, "L16/16000"),
    ("PCMU/8000/1", 8000, "PCMU"),
])
async def test_baresip_hears_its_own_voice_back_and_its_keys_reach_the_call(
    sip_server: SipServer, tmp_path: Path, codec: str, rate: int, agent_codec: str,
) -> None:
    signal = make_test_signal(SECONDS, rate)
    wav = tmp_path / "speech.wav"
    write_wav(wav, signal, rate)
    async with baresip(tmp_path, wav, rate, codec) as phone:
        await phone.command("dial", f"sip:agent@{HOST}:{sip_server.ua.port}")
        await phone.event("CALL_ESTABLISHED")
        (leg,) = list(sip_server.agent.legs)
        assert leg.stats()["codec"] == agent_codec
        keys = agent_codec == "G722"  # telephone-event/8000: on G.722's and G.711's clock
        if keys:  # pressed on baresip, watched on the call's sideband websocket
            async with aiohttp.ClientSession() as http, http.ws_connect(
                    f"{sip_server.url}/v1/realtime?call_id={leg.id}") as sideband:
                for digit in "5#":
                    await asyncio.sleep(0.3)
                    await phone.command("sndcode", digit)
                digits = await dtmf_events(sideband, 2)
            assert digits == ["5", "#"], list(leg.events)
        # baresip hangs up when its WAV ends; the agent frees the call.
        await phone.event("CALL_CLOSED", timeout=SECONDS + 15)
        await wait_until(sip_server.quiet)
        heard, heard_rate = read_wav(phone.recording("dec"))
    assert heard_rate == rate
    echo = measure_echo(signal, heard, rate)
    print(f"\nbaresip {codec}: echo correlation {echo.correlation:.3f}, "
          f"lag {echo.lag_seconds:.3f} s, holes {echo.holes}")
    assert echo.correlation >= 0.9, echo
    async with aiohttp.ClientSession() as http:
        async with http.get(sip_server.url + "/health") as reply:
            sip = (await reply.json())["sip"]
    assert (sip["dialogs"], sip["legs"]) == (0, 0)
