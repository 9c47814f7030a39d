"""`python -m signaling` start-up mistakes: one `error [code]: message` line, exit 2."""

from __future__ import annotations

import asyncio
import socket
import sys
from pathlib import Path

import pytest
import torch

from agent.plugins.personaplex.tiny_checkpoint import write_checkpoint
from tests.support.server_process import free_tcp_port

ROOT = Path(__file__).resolve().parents[2]


async def run_server(*flags: str) -> tuple[int, str]:
    server = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "signaling", *flags, cwd=str(ROOT),
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
    )
    try:
        _, err = await asyncio.wait_for(server.communicate(), 120)
    finally:
        if server.returncode is None:
            server.kill()
            await server.wait()
    assert server.returncode is not None
    return server.returncode, err.decode()


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("error [")]


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch.set_num_threads(1)
    return write_checkpoint(tmp_path_factory.mktemp("tiny"), "tiny", "personaplex", seed=0)


@pytest.mark.parametrize("flags, code, says", [
    (["--plugin", "personaplex"], "model_dir_invalid", "--model-dir"),
    (["--plugin", "personaplex", "--model-dir", "/nonexistent/model"], "model_dir_invalid",
     "/nonexistent/model"),
    (["--tls-cert", "missing.pem", "--tls-key", "missing.key"], "tls_invalid", "cannot load"),
])
async def test_bad_start_up_flags_print_one_line(flags: list[str], code: str,
                                                 says: str) -> None:
    rc, err = await run_server("--port", str(free_tcp_port()), *flags)
    assert rc == 2
    # The whole of stderr: no warning (such as the one about --api-key) before the error.
    assert err.splitlines() == error_lines(err), err
    assert len(error_lines(err)) == 1 and error_lines(err)[0].startswith(f"error [{code}]: ")
    assert says in error_lines(err)[0]
    assert "Traceback" not in err


async def test_unknown_voice_is_one_line_and_debug_shows_the_traceback(tiny_dir: Path) -> None:
    flags = ["--port", str(free_tcp_port()), "--plugin", "personaplex",
             "--model-dir", str(tiny_dir), "--voice", "NOPE.pt"]
    rc, err = await run_server(*flags)
    assert rc == 2 and "Traceback" not in err
    assert error_lines(err) and error_lines(err)[0].startswith("error [invalid_voice]: ")
    assert "NATF2.pt" in err  # says what is available
    rc, err = await run_server(*flags, "--log-level", "debug")
    assert rc == 2 and "Traceback" in err


async def test_port_in_use_is_one_line() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        rc, err = await run_server("--port", str(port))
    assert rc == 2 and "Traceback" not in err
    assert error_lines(err) == [
        f"error [port_in_use]: 127.0.0.1:{port} is already in use (another server?); "
        "pick another --port"]
