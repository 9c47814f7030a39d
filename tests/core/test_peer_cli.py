"""`python -m agent.peer`: arguments checked before dialling, a --play file played to its end."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import pytest

from agent.testing.peer import event_counts, save_wav
from agent.testing.testsignal import make_test_signal
from tests.support.agents import RunningAgent


async def run_peer(*argv: str) -> tuple[int, str, str]:
    peer = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "agent.peer", *argv,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(peer.communicate(), 90)
    assert peer.returncode is not None
    return peer.returncode, out.decode(), err.decode()


@pytest.mark.parametrize("argv,code", [
    (["--play", "/no/such.wav"], "play_not_found"),
    (["--play", "{bad_wav}"], "play_unreadable"),
    (["--record", "/no/such/folder/out.wav"], "record_unwritable"),
    (["--session", "{not json"], "invalid_session"),
    (["--session", "[1, 2]"], "invalid_session"),
])
async def test_bad_arguments_fail_in_one_line_before_dialling(
    tmp_path: Path, argv: list[str], code: str
) -> None:
    bad_wav = tmp_path / "bad.wav"
    bad_wav.write_text("not audio")
    argv = [arg.replace("{bad_wav}", str(bad_wav)) for arg in argv]
    # Port 9 (discard) would make a dialled call fail differently, and later.
    status, out, err = await run_peer("http://127.0.0.1:9", *argv)
    assert status == 2 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error [{code}]: "), err
    assert "Traceback" not in err and "Errno" not in err


async def test_a_play_file_is_played_to_its_end(echo_agent: RunningAgent, tmp_path: Path) -> None:
    save_wav(str(tmp_path / "in.wav"), make_test_signal(2.0))
    status, out, err = await run_peer(echo_agent.url, "--play", str(tmp_path / "in.wav"),
                                      "--record", str(tmp_path / "out.wav"), "--json",
                                      "--ice-host", "127.0.0.1")
    report = json.loads(out)
    assert status == 0 and report["ok"], err
    # The whole file, then 1 s more to hear its end come back (the old default cut at 5 s,
    # and a longer file was cut short): the call lasts 3 s, and a sender that a loaded machine
    # slowed sends less than 3 s in them (it paces by its clock and does not catch up), but
    # all of the 2 s file. The echo of what was sent comes back within the 1 s tail.
    assert 2.0 <= report["seconds_sent"] <= 3.1
    assert report["seconds_received"] > report["seconds_sent"] - 1.0
    assert isinstance(report["events"], dict) and report["events"].get("session.created") == 1
    assert (tmp_path / "out.wav").stat().st_size > 44


def test_events_collapse_into_counts_in_first_seen_order() -> None:
    counts = event_counts(["a", "b", "a", "c", "b", "a"])
    assert counts == {"a": 3, "b": 2, "c": 1} and list(counts) == ["a", "b", "c"]
