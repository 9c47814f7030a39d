"""scripts/install-test-deps.sh (CI runs it too): a quiet success that leaves no service enabled.

Read, not run (it installs system packages): every pip line keeps pip's report of moshi's
unmet pins out (`--no-deps`, which skips it, or `--no-warn-conflicts`), the servers it
installs as test tools are stopped and disabled under systemd and sysvinit alike, and any
other service its packages enabled goes the same way.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "install-test-deps.sh"
SERVERS = ["coturn", "kamailio", "haproxy", "redis-server"]


def test_the_script_parses() -> None:
    subprocess.run(["bash", "-n", str(SCRIPT)], check=True)


def test_no_pip_line_prints_the_resolver_report() -> None:
    lines = " ".join(SCRIPT.read_text().replace("\\\n", " ").splitlines())
    installs = re.findall(r"python -m pip install [^;&|]*?(?=python -m pip|$)", lines)
    assert installs
    for line in installs:
        assert "--no-deps" in line or "--no-warn-conflicts" in line, line


def test_every_server_it_installs_is_disabled_and_stopped() -> None:
    text = SCRIPT.read_text()
    (loop,) = re.findall(r"^for service in ([^;]+);", text, re.MULTILINE)
    assert set(SERVERS) <= set(loop.split()) and "$newly_enabled" in loop
    for package in SERVERS:
        assert re.search(rf"\b{package}\b", text.split("done", 1)[0]), package
    assert "systemctl disable --now" in text and "update-rc.d" in text
    assert "deb-systemd-helper disable" in text and "service \"$1\" stop" in text
