"""Every entry point's start-up mistakes, run as a user runs them (a process each): exactly
one line on stderr, `error [code]: message`, and exit status 2 — no usage block, no
traceback, no warning before it. argparse's own mistakes name the closest known flag and the
program as it was run (`duplex-agent` or `python -m signaling`).

The processes run side by side once for the module (each is about a second of imports), and
each case then checks its own result. Variations of one kind run in this process."""

from __future__ import annotations

import concurrent.futures
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from signaling.__main__ import main as server_main

ROOT = Path(__file__).resolve().parents[2]
CONSOLE_SCRIPT = Path(sys.executable).parent / "duplex-agent"
SERVER = [sys.executable, "-m", "signaling"]
OFFLINE = [sys.executable, "-m", "agent.offline"]
PEER = [sys.executable, "-m", "agent.peer"]
NOWHERE = "http://127.0.0.1:9"  # discard: never dialled, the arguments are refused first


@dataclass(frozen=True)
class Case:
    argv: list[str]
    code: str
    says: str
    env: tuple[tuple[str, str], ...] = ()


CASES = {
    "unknown plugin": Case([*SERVER, "--plugin", "nosuch"], "unknown_plugin",
                           "no plugin named 'nosuch'; available: echo,"),
    "misspelt flag": Case([*SERVER, "--prot", "8090"], "bad_argument",
                          "unrecognized arguments: --prot 8090 (did you mean --port?); "
                          "see `python -m signaling --help`"),
    "bad value from the environment": Case(
        SERVER, "bad_argument", "invalid int value: 'abc' (from the environment: AGENT_PORT)",
        env=(("AGENT_PORT", "abc"),)),
    "model flag to echo": Case([*SERVER, "--model-dir", "/tmp"], "flag_not_for_plugin",
                               "--model-dir is not an option of the echo plugin"),
    "worker index by hand": Case([*SERVER, "--worker-index", "0"], "not_a_worker",
                                 "set by the supervisor"),
    "offline without its files": Case(OFFLINE, "bad_argument",
                                      "the following arguments are required: --model-dir"),
    "offline input missing": Case(
        [*OFFLINE, "--model-dir", "/tmp", "--input", "/no/such.wav", "--output", "/tmp/o.wav"],
        "input_not_found", "--input /no/such.wav: no such file"),
    "peer without a URL": Case(PEER, "bad_argument",
                               "the following arguments are required: url; "
                               "see `python -m agent.peer --help`"),
    "peer misspelt flag": Case([*PEER, NOWHERE, "--sesion", "{}"], "bad_argument",
                               "(did you mean --session?)"),
    "peer repeat 0": Case([*PEER, NOWHERE, "--repeat", "0"], "invalid_repeat", "--repeat"),
    "peer script missing": Case([*PEER, NOWHERE, "--script", "/no/such.yaml"],
                                "script_not_found", "--script /no/such.yaml: no such file"),
}
if CONSOLE_SCRIPT.exists():  # installed with pip: the name the user typed
    CASES["console script"] = Case([str(CONSOLE_SCRIPT), "--prot", "8090"], "bad_argument",
                                   "(did you mean --port?); see `duplex-agent --help`")


def run(case: Case) -> subprocess.CompletedProcess[str]:
    env = {key: value for key, value in os.environ.items() if not key.startswith("AGENT_")}
    return subprocess.run(case.argv, cwd=ROOT, env={**env, **dict(case.env)}, capture_output=True,
                          text=True, timeout=120)


@pytest.fixture(scope="module")
def results() -> dict[str, subprocess.CompletedProcess[str]]:
    with concurrent.futures.ThreadPoolExecutor((os.cpu_count() or 1) + 1) as pool:
        running = {name: pool.submit(run, case) for name, case in CASES.items()}
        return {name: job.result() for name, job in running.items()}


@pytest.mark.slow  # the first case waits for all the processes: about 5 s
@pytest.mark.parametrize("name", list(CASES))
def test_a_start_up_mistake_is_one_coded_line_and_exit_2(
        results: dict[str, subprocess.CompletedProcess[str]], name: str) -> None:
    case, done = CASES[name], results[name]
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith(f"error [{case.code}]: "), done.stderr
    assert case.says in lines[0]
    assert (done.returncode, done.stdout) == (2, "")


@pytest.mark.parametrize("argv, code, says", [
    (["--port", "notaport"], "bad_argument", "argument --port: invalid int value: 'notaport'"),
    (["--log-level", "loud"], "bad_argument", "argument --log-level: invalid choice: 'LOUD'"),
    (["--workers", "0"], "bad_argument", "expected a whole number of at least 1, not '0'"),
    (["--max-sessions", "-1"], "bad_argument", "expected a whole number of at least 0"),
    (["--header-timeout", "-1"], "bad_argument", "expected 0 or more seconds, not '-1'"),
    (["--ice-host", "999.1.1.1"], "bad_argument", "expected an IP address, not '999.1.1.1'"),
    (["--record-dir", "/proc/no-such-folder"], "record_dir_unwritable",
     "--record-dir /proc/no-such-folder: No such file or directory"),
    (["--sampling", "greedy"], "bad_argument", "unrecognized arguments: --sampling greedy "
     "(--sampling is an option of the moshi, personaplex plugins: add --plugin moshi)"),
    (["--upstream-kind", "kyutai"], "bad_argument",
     "(--upstream-kind is an option of the moshi-server plugin: add --plugin moshi-server)"),
    (["--upstream", "ws://127.0.0.1:9/x"], "flag_not_for_plugin",
     "--upstream is not an option of the echo plugin (it takes none of the model flags)"),
    (["--plugin", "vllm-omni", "--upstream", "ws://127.0.0.1:9/x", "--device", "cuda"],
     "flag_not_for_plugin", "(its model flags: --model, --upstream, --voice)"),
    (["--plugin", "moshi-server", "--model-dir", "/tmp"], "flag_not_for_plugin",
     "--model-dir is not an option of the moshi-server plugin"),
])
def test_more_server_mistakes_in_one_line(capsys: pytest.CaptureFixture[str],
                                          monkeypatch: pytest.MonkeyPatch, argv: list[str],
                                          code: str, says: str) -> None:
    for key in [key for key in os.environ if key.startswith("AGENT_")]:
        monkeypatch.delenv(key)
    with pytest.raises(SystemExit) as stopped:
        server_main(argv)
    lines = capsys.readouterr().err.splitlines()
    assert stopped.value.code == 2 and len(lines) == 1
    assert lines[0].startswith(f"error [{code}]: ") and says in lines[0]
