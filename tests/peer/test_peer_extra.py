"""The peer without its extra (PyYAML, jsonschema, pesq, webrtcvad, matplotlib, tqdm), as
`pip install -e .` leaves it: a plain call works and reports, and a feature that needs the
extra is refused in one line, `error [missing_extra]: ...`, exit status 2, before dialling.

The extra's modules are made unimportable in the peer's process by a `sitecustomize` on
PYTHONPATH, so no second environment is built."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

import pytest

from tests.support.agents import RunningAgent

ROOT = Path(__file__).resolve().parents[2]
EXTRA = ("yaml", "jsonschema", "pesq", "webrtcvad", "matplotlib", "tqdm")
BLOCKER = f'''
import sys


class _WithoutThePeerExtra:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {EXTRA!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None


sys.meta_path.insert(0, _WithoutThePeerExtra())
'''


@pytest.fixture
def no_extra_env(tmp_path: Path) -> dict[str, str]:
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(BLOCKER)
    paths = [str(site), *filter(None, [os.environ.get("PYTHONPATH")])]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}


async def run_peer(env: dict[str, str], *argv: str) -> tuple[int, str, str]:
    peer = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "agent.peer", *argv, cwd=str(ROOT), env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(peer.communicate(), 90)
    assert peer.returncode is not None
    return peer.returncode, out.decode(), err.decode()


async def test_the_blocker_hides_the_extra(no_extra_env: dict[str, str]) -> None:
    probe = await asyncio.create_subprocess_exec(
        sys.executable, "-c", "import yaml", env=no_extra_env,
        stderr=asyncio.subprocess.PIPE)
    _, err = await asyncio.wait_for(probe.communicate(), 60)
    assert probe.returncode == 1 and b"No module named 'yaml'" in err


async def test_a_plain_call_needs_no_extra(echo_agent: RunningAgent,
                                           no_extra_env: dict[str, str]) -> None:
    status, out, err = await run_peer(no_extra_env, echo_agent.url, "--json",
                                      "--seconds", "2", "--ice-host", "127.0.0.1")
    assert status == 0, err
    assert "Traceback" not in err
    report = json.loads(out)
    assert report["connected"] and report["delay_ms"] is not None
    assert report["pesq"] is None
    assert report["pesq_error"] == "PESQ needs the peer extra: pip install -e '.[peer]'"


@pytest.mark.parametrize("argv, feature", [
    (["--script", "examples/greeting.yaml"], "--script"),
    (["--timeline", "{tmp}"], "--timeline"),
    (["--min-pesq", "3.5"], "--min-pesq"),
    (["--pesq", "wb"], "--pesq"),
])
async def test_a_feature_of_the_extra_says_how_to_install_it(
        no_extra_env: dict[str, str], tmp_path: Path, argv: list[str], feature: str) -> None:
    argv = [arg.replace("{tmp}", str(tmp_path / "out")) for arg in argv]
    # Port 9 (discard): a call that was dialled would fail differently, and later.
    status, out, err = await run_peer(no_extra_env, "http://127.0.0.1:9", *argv)
    assert (status, out) == (2, "")
    assert err.splitlines() == [
        f"error [missing_extra]: {feature} needs the peer extra: pip install -e '.[peer]'"]
