"""The built wheel serves the page: `pip wheel .`, installed into a fresh venv, started as
`duplex-agent` from another directory, answers `/` and every module the page loads.

The wheel is built from a copy of the project (so the working tree gets no build/ folder and
no stale build/lib can leak into the wheel). The venv sees the site-packages of the
environment running the tests, the project's own venv or the system's (torch, aiortc, ... are
not installed again), through a `.pth` file that lists them; their own `.pth` files are not
run, so the working tree's editable install stays out, and the test checks that `signaling`
there is the wheel's copy.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import site
import subprocess
import sys
import time
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import aiohttp
import pytest
from playwright.async_api import Response
from setuptools import find_namespace_packages

from tests.support import SPEECH_WAV
from tests.support.chromium import chromium_path, launch_chromium
from tests.support.server_process import free_tcp_port

ROOT = Path(__file__).resolve().parents[2]
WEB = ROOT / "web"
BUILD_TIMEOUT = 120
START_TIMEOUT = 45.0
PAGE_TIMEOUT_MS = 15_000
# Not needed to build the wheel, and big or changing under other tools.
COPY_IGNORE = shutil.ignore_patterns(".git", "build", "dist", "artifacts", "checkpoints",
                                     "*.egg-info", "__pycache__", "*.pyc", "node_modules",
                                     ".venv", "venv", ".pytest_cache", ".gl", "*.safetensors")


def require_chromium() -> str:
    """Chromium's path; skip without it, except when `CI` is set (then fail)."""
    path = chromium_path()
    if path is None:
        message = "Chromium is not installed (apt install chromium, or set CHROMIUM=...)"
        if os.environ.get("CI"):
            pytest.fail(f"{message}; CI must run the wheel test", pytrace=False)
        pytest.skip(message)
    return path


def run(args: list[str], cwd: Path, timeout: float = BUILD_TIMEOUT) -> str:
    result = subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=timeout,
                            check=False,
                            env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1",
                                 "PIP_NO_INPUT": "1"})
    output = result.stdout + result.stderr
    assert result.returncode == 0, f"{' '.join(args)} failed ({result.returncode}):\n{output}"
    return output


@dataclass
class Installed:
    wheel: Path
    venv: Path

    @property
    def python(self) -> Path:
        return self.venv / "bin" / "python"

    @property
    def script(self) -> Path:
        return self.venv / "bin" / "duplex-agent"


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Installed]:
    tmp = tmp_path_factory.mktemp("wheel")
    source = tmp / "src"
    shutil.copytree(ROOT, source, ignore=COPY_IGNORE, symlinks=True)
    dist = tmp / "dist"
    run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
         "-w", str(dist), "."], cwd=source)
    wheels = sorted(dist.glob("duplex_agent-*.whl"))
    assert len(wheels) == 1, f"expected one duplex_agent wheel in {dist}: {wheels}"
    venv = tmp / "venv"
    # No pip of its own (ensurepip is slow): the current environment's pip, run by the venv's
    # python, installs into the venv.
    run([sys.executable, "-m", "venv", "--without-pip", str(venv)], cwd=tmp)
    result = Installed(wheels[0], venv)
    see_current_environment(result.python)
    run([str(result.python), "-m", "pip", "install", "--no-deps", "--force-reinstall",
         "--ignore-installed", "--no-compile", str(wheels[0])], cwd=tmp)
    yield result


def current_site_packages() -> list[str]:
    """Every site-packages folder this interpreter imports from (inside a venv: the venv's,
    not the base interpreter's that `venv --system-site-packages` would give)."""
    folders = [*site.getsitepackages()]
    if site.ENABLE_USER_SITE:
        folders.append(site.getusersitepackages())
    return list(dict.fromkeys(f for f in folders if os.path.isdir(f)))


def see_current_environment(python: Path) -> None:
    """A `.pth` in the new venv listing the current environment's site-packages: appended to
    its path after its own, their `.pth` files (an editable install's) not run."""
    purelib = run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                  cwd=python.parent).strip().splitlines()[-1]
    Path(purelib, "current-environment.pth").write_text(
        "".join(f"{folder}\n" for folder in current_site_packages()))


def test_wheel_holds_the_page_and_every_package(installed: Installed) -> None:
    with zipfile.ZipFile(installed.wheel) as wheel:
        names = set(wheel.namelist())
    pages = {p.name for p in WEB.iterdir() if p.is_file() and p.suffix in {".html", ".js", ".css"}}
    assert pages >= {"index.html", "app.js", "style.css"}
    missing = sorted(name for name in pages if f"signaling/web/{name}" not in names)
    assert not missing, f"the wheel lacks these page files: {missing}"
    stray = sorted(n for n in names if n.startswith(("web/", "signaling/web/tests/"))
                   or "node_modules" in n or n.endswith("package.json"))
    assert not stray, f"the wheel holds files that are not the page: {stray}"
    # Every package of the source tree is in the wheel (an explicit package list that
    # forgot a new one would lose it here, not at a user's import).
    packages = [p for p in find_namespace_packages(where=str(ROOT),
                                                    include=["agent*", "signaling*"])
                if any((ROOT / p.replace(".", "/")).glob("*.py"))]
    wheel_dirs = {n.rpartition("/")[0] for n in names if n.endswith(".py")}
    lacking = sorted(p for p in packages if p.replace(".", "/") not in wheel_dirs)
    assert not lacking, f"the wheel lacks these packages: {lacking}"
    # The test peer and its test signal ship (users run them); the doubles only the project's
    # own tests and benchmarks use live in tests/support/ and do not.
    testing = sorted(n.removeprefix("agent/testing/") for n in names
                     if n.startswith("agent/testing/") and not n.startswith("agent/testing/peer/"))
    assert testing == ["__init__.py", "testsignal.py"], f"agent/testing/ in the wheel: {testing}"
    assert not any(n.startswith("tests/") for n in names), "the wheel holds tests/"


def test_venv_imports_the_wheel_not_the_working_tree(installed: Installed) -> None:
    out = run([str(installed.python), "-c",
               ("import agent, signaling, signaling.page as p; "
                "print(signaling.__file__); print(agent.__file__); print(p.web_dir())")],
              cwd=installed.venv.parent, timeout=60)
    paths = [Path(line).resolve() for line in out.strip().splitlines()[-3:]]
    venv = installed.venv.resolve()
    for path in paths:
        assert path.is_relative_to(venv), f"{path} is not inside the venv {venv}:\n{out}"
    assert (paths[2] / "index.html").is_file()


def stop(server: subprocess.Popen[bytes]) -> None:
    if server.poll() is not None:
        return
    server.terminate()
    try:
        server.wait(timeout=15)
    except subprocess.TimeoutExpired:
        os.killpg(server.pid, signal.SIGKILL)  # its own session: the server and its workers
        server.wait(timeout=10)


async def wait_serving(url: str, server: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=3)) as http:
        while True:
            if server.poll() is not None:
                raise AssertionError(f"duplex-agent ended ({server.returncode}):\n"
                                     + log.read_text(errors="replace"))
            try:
                async with http.get(f"{url}/health/live") as response:
                    if response.status == 200:
                        return
            except (aiohttp.ClientError, asyncio.TimeoutError):
                pass
            if time.monotonic() > deadline:
                raise AssertionError(f"duplex-agent not serving after {START_TIMEOUT:.0f} s:\n"
                                     + log.read_text(errors="replace"))
            await asyncio.sleep(0.25)


@pytest.mark.browser
async def test_installed_wheel_serves_the_page(installed: Installed,
                                               tmp_path: Path) -> None:
    require_chromium()
    elsewhere = tmp_path / "elsewhere"  # no web/ here, nor above
    elsewhere.mkdir()
    port = free_tcp_port()
    url = f"http://127.0.0.1:{port}"
    log = tmp_path / "server.log"
    with log.open("wb") as log_file:
        server = subprocess.Popen(  # noqa: ASYNC220 (returns at once)
            [str(installed.script), "--port", str(port), "--workers", "1",
             "--ice-host", "127.0.0.1"],
            cwd=elsewhere, stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True,
        )
    try:
        await wait_serving(url, server, log)
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as http:
            async with http.get(f"{url}/") as response:
                body = await response.text()
                assert response.status == 200, body
                assert "/static/app.js" in body
            # Every file of the page, also those loaded only during a call (the worklet).
            for name in sorted(p.name for p in WEB.iterdir()
                               if p.is_file() and p.suffix in {".js", ".css"}):
                async with http.get(f"{url}/static/{name}") as response:
                    assert response.status == 200, f"/static/{name}: {response.status}"

        responses: list[tuple[int, str, str]] = []

        def on_response(response: Response) -> None:
            responses.append((response.status, response.request.resource_type, response.url))

        async with launch_chromium(SPEECH_WAV) as browser:
            context = await browser.new_context()
            page = await context.new_page()
            page.on("response", on_response)
            page.set_default_timeout(PAGE_TIMEOUT_MS)
            first = await page.goto(url, wait_until="load")
            assert first is not None and first.status == 200
            await page.wait_for_load_state("networkidle")
            await context.close()
        local = [r for r in responses if urlsplit(r[2]).netloc == f"127.0.0.1:{port}"]
        bad = [r for r in local if r[0] >= 400]
        assert not bad, f"the page's requests failed: {bad}\nall: {local}"
        loaded = {urlsplit(r[2]).path for r in local if r[1] in {"script", "stylesheet"}}
        assert {"/static/app.js", "/static/style.css", "/static/call.js"} <= loaded, local
    finally:
        stop(server)
