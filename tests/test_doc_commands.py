"""The shell blocks of README.md and docs/*.md marked `<!-- test: run -->` (the line before the
fence) run as written against a real server, so the quick starts cannot go stale.

The server is `python -m signaling` on free loopback ports (HTTP, and SIP with
`--sip-listen`), and in each block `127.0.0.1:8080` and `127.0.0.1:5060`, the documented
defaults, become those ports. A block runs in bash (`set -euo pipefail`: every command must
succeed) in a folder of its own that holds a link to `examples/`, with this interpreter first
on PATH; the blocks run side by side. docs/testing.md describes the convention.
"""

from __future__ import annotations

import asyncio
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest

from tests.support.server_process import free_tcp_port

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
MARK = "<!-- test: run -->"
BLOCK_SECONDS = 60.0
START_SECONDS = 60.0


@dataclass(frozen=True)
class Block:
    where: str  # file:line of the fence
    text: str


def marked_blocks(path: Path) -> list[Block]:
    """Every fenced block right after a MARK line (indented ones too, as in a list item)."""
    lines = path.read_text().splitlines()
    blocks = []
    for index, line in enumerate(lines):
        if line.strip() != MARK:
            continue
        where = f"{path.relative_to(ROOT)}:{index + 2}"
        fence = lines[index + 1] if index + 1 < len(lines) else ""
        assert fence.lstrip().startswith("```"), f"{where}: {MARK} is not followed by a fence"
        indent = len(fence) - len(fence.lstrip())
        body = []
        for text in lines[index + 2:]:
            if text.strip().startswith("```"):
                break
            body.append(text[indent:])
        else:
            raise AssertionError(f"{where}: the block never ends")
        blocks.append(Block(where, "\n".join(body) + "\n"))
    return blocks


BLOCKS = [block for path in DOCS for block in marked_blocks(path)]


def test_the_quick_starts_are_marked() -> None:
    marked = {block.where.split(":")[0] for block in BLOCKS}
    assert {"README.md", "docs/testing.md", "docs/sip.md"} <= marked, marked


async def wait_ready(url: str, server: asyncio.subprocess.Process, log: Path) -> None:
    deadline = asyncio.get_running_loop().time() + START_SECONDS
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2)) as http:
        while True:
            assert server.returncode is None, log.read_text()
            try:
                async with http.get(f"{url}/health/ready") as response:
                    if response.status == 200:
                        return
            except (aiohttp.ClientError, asyncio.TimeoutError):
                pass
            assert asyncio.get_running_loop().time() < deadline, log.read_text()
            await asyncio.sleep(0.1)


async def run_block(block: Block, folder: Path, ports: dict[str, str]) -> tuple[int, str]:
    folder.mkdir()
    (folder / "examples").symlink_to(ROOT / "examples")
    text = block.text
    for written, real in ports.items():
        text = text.replace(written, real)
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    shell = await asyncio.create_subprocess_exec(
        "bash", "-c", "set -euo pipefail\n" + text, cwd=folder, env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    try:
        out, _ = await asyncio.wait_for(shell.communicate(), BLOCK_SECONDS)
    finally:
        if shell.returncode is None:
            shell.kill()
            await shell.wait()
    assert shell.returncode is not None
    return shell.returncode, out.decode(errors="replace")


@pytest.mark.slow  # the blocks place real calls of a few seconds each, side by side
async def test_every_marked_block_runs_as_written(tmp_path: Path) -> None:
    http_port, sip_port = free_tcp_port(), free_tcp_port()
    log = tmp_path / "server.log"
    with log.open("wb") as log_file:
        server = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "signaling", "--port", str(http_port), "--workers", "1",
            "--ice-host", "127.0.0.1", "--sip-listen", f"127.0.0.1:{sip_port}",
            "--rtp-bind", "127.0.0.1", cwd=ROOT, stdout=log_file, stderr=log_file)
    try:
        await wait_ready(f"http://127.0.0.1:{http_port}", server, log)
        ports = {"127.0.0.1:8080": f"127.0.0.1:{http_port}",
                 "127.0.0.1:5060": f"127.0.0.1:{sip_port}"}
        results = await asyncio.gather(*(
            run_block(block, tmp_path / f"block{index}", ports)
            for index, block in enumerate(BLOCKS)))
    finally:
        if server.returncode is None:
            server.terminate()
            try:
                await asyncio.wait_for(server.wait(), 15)
            except asyncio.TimeoutError:
                server.kill()
                await server.wait()
    failed = [f"{block.where} exited {status}:\n{out[-2000:]}"
              for block, (status, out) in zip(BLOCKS, results, strict=True) if status != 0]
    assert not failed, "\n\n".join(failed)
