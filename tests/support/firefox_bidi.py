"""Headless Debian Firefox (firefox-esr) driven over WebDriver BiDi, for a page smoke test.

Playwright only drives its own patched Firefox build, so this speaks the W3C BiDi protocol
directly over the websocket Firefox opens with `--remote-debugging-port`. Only what the
test needs: navigate, evaluate, a real pointer click (user activation), and console errors.

The profile gives Firefox a fake microphone (a tone), skips the permission prompt, keeps
host candidates as plain addresses (Firefox hides them behind mDNS names otherwise, which
the agent's ICE cannot resolve on a closed network) and allows loopback candidates.
"""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp

PREFS = {
    "media.navigator.streams.fake": True,
    "media.navigator.permission.disabled": True,
    "media.autoplay.default": 0,
    "media.autoplay.block-webaudio": False,
    "media.peerconnection.ice.obfuscate_host_addresses": False,
    # The agent offers 127.0.0.1 only in tests; Firefox pairs nothing with it without this.
    "media.peerconnection.ice.loopback": True,
    "browser.shell.checkDefaultBrowser": False,
    "datareporting.policy.dataSubmissionEnabled": False,
    "toolkit.telemetry.reportingpolicy.firstRun": False,
    "app.update.disabledForTesting": True,
    "browser.startup.homepage_override.mstone": "ignore",
}
LISTENING = re.compile(r"WebDriver BiDi listening on (ws://\S+)")


def firefox_path() -> str | None:
    return shutil.which("firefox-esr") or shutil.which("firefox")


class BidiError(RuntimeError):
    pass


class FirefoxPage:
    """One browsing context of a BiDi session."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self.ws = ws
        self.context = ""
        self.console_errors: list[str] = []
        self._next_id = 0
        self._pending: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._reader = asyncio.ensure_future(self._read())

    async def _read(self) -> None:
        async for message in self.ws:
            data = json.loads(message.data)
            future = self._pending.pop(data.get("id", -1), None)
            if future is not None:
                future.set_result(data)
            elif data.get("method") == "log.entryAdded":
                entry = data["params"]
                if entry.get("level") == "error":
                    self.console_errors.append(entry.get("text", ""))

    async def command(self, method: str, **params: Any) -> dict[str, Any]:
        self._next_id += 1
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._pending[self._next_id] = future
        await self.ws.send_str(json.dumps({"id": self._next_id, "method": method,
                                           "params": params}))
        reply = await asyncio.wait_for(future, timeout=30)
        if reply.get("type") == "error":
            raise BidiError(f"{method}: {reply.get('error')}: {reply.get('message')}")
        return reply["result"]

    async def open(self, url: str) -> None:
        await self.command("session.new", capabilities={})
        await self.command("session.subscribe", events=["log.entryAdded"])
        tree = await self.command("browsingContext.getTree")
        self.context = tree["contexts"][0]["context"]
        await self.command("browsingContext.navigate", context=self.context, url=url,
                           wait="complete")

    async def evaluate(self, expression: str) -> Any:
        """The value of `expression` (awaited), passed through JSON."""
        result = await self.command(
            "script.evaluate", expression=f"(async () => JSON.stringify(await ({expression})))()",
            target={"context": self.context}, awaitPromise=True,
        )
        if result["type"] != "success":
            raise BidiError(f"evaluate failed: {result.get('exceptionDetails', {}).get('text')}")
        value = result["result"].get("value")
        return None if value is None else json.loads(value)

    async def wait_for(self, expression: str, timeout: float = 15.0) -> Any:
        deadline = asyncio.get_running_loop().time() + timeout
        while True:
            value = await self.evaluate(expression)
            if value:
                return value
            if asyncio.get_running_loop().time() > deadline:
                raise AssertionError(f"timed out waiting for {expression}")
            await asyncio.sleep(0.2)

    async def click(self, selector: str) -> None:
        """A real pointer click (user activation), at the element's centre."""
        box = await self.evaluate(
            f"(() => {{ const r = document.querySelector({json.dumps(selector)})"
            ".getBoundingClientRect(); return [r.x + r.width / 2, r.y + r.height / 2]; })()"
        )
        await self.command("input.performActions", context=self.context, actions=[{
            "type": "pointer", "id": "mouse", "parameters": {"pointerType": "mouse"},
            "actions": [
                {"type": "pointerMove", "x": int(box[0]), "y": int(box[1])},
                {"type": "pointerDown", "button": 0},
                {"type": "pointerUp", "button": 0},
            ],
        }])

    async def close(self) -> None:
        try:
            await self.command("session.end")
        finally:
            self._reader.cancel()


@asynccontextmanager
async def launch_firefox(startup_timeout: float = 60.0) -> AsyncIterator[str]:
    """Start headless Firefox; yields its BiDi websocket URL."""
    executable = firefox_path()
    if executable is None:
        raise RuntimeError("Firefox not found (apt install firefox-esr)")
    with tempfile.TemporaryDirectory() as profile:
        prefs = "".join(f"user_pref({json.dumps(k)}, {json.dumps(v)});\n" for k, v in PREFS.items())
        (Path(profile) / "user.js").write_text(prefs)
        log_path = Path(profile) / "firefox.log"
        with log_path.open("wb") as log:
            process = await asyncio.create_subprocess_exec(
                executable, "--headless", "--no-remote", "--profile", profile,
                "--remote-debugging-port", "0", "about:blank",
                stdout=log, stderr=log,
            )
        try:
            deadline = asyncio.get_running_loop().time() + startup_timeout
            while not (match := LISTENING.search(log_path.read_text(errors="replace"))):
                if process.returncode is not None or asyncio.get_running_loop().time() > deadline:
                    raise RuntimeError("Firefox did not start its BiDi server:\n"
                                       + log_path.read_text(errors="replace")[-2000:])
                await asyncio.sleep(0.2)
            yield match.group(1)
        finally:
            if process.returncode is None:
                process.terminate()
                try:
                    await asyncio.wait_for(process.wait(), timeout=10)
                except asyncio.TimeoutError:
                    process.kill()
                    await process.wait()


@asynccontextmanager
async def firefox_page(url: str) -> AsyncIterator[FirefoxPage]:
    async with launch_firefox() as endpoint:
        async with aiohttp.ClientSession() as http:
            async with http.ws_connect(endpoint.rstrip("/") + "/session", max_msg_size=0) as ws:
                page = FirefoxPage(ws)
                try:
                    await page.open(url)
                    yield page
                finally:
                    await page.close()
