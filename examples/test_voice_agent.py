"""Testing a voice agent from pytest with the duplex-agent plugin (installed with the package
and its peer extra, from a clone: `pip install -e '.[peer]'`; fixtures `agent_server` and
`agent_call`). Run it from the clone: `python -m pytest -q examples/test_voice_agent.py`.

`agent_server` starts `python -m signaling` with the marker's flags on a free port and stops
it afterwards; `agent_call` places a call (any transport) and returns its report, whose
`checks` hold each expectation's measured value and threshold.
"""

from __future__ import annotations

from pathlib import Path

import pytest

HERE = Path(__file__).parent


@pytest.mark.agent_server("--plugin", "echo")
def test_the_agent_answers_a_greeting(agent_server, agent_call):
    report = agent_call(agent_server, script=HERE / "greeting.yaml")
    assert report.ok, [check.message for check in report.checks if not check.passed]


@pytest.mark.agent_server("--plugin", "echo")
def test_the_echo_comes_back_on_a_phone_line(agent_server, agent_call):
    report = agent_call(agent_server, transport="media-stream", seconds=2.0)
    assert report.ok and (report.codec or "").lower() == "pcmu" and report.delay_ms is not None
