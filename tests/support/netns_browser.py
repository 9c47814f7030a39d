"""Headless Chromium inside a network namespace, driven by Playwright from outside it.

Playwright starts the browser it is given and talks to it over pipes (`--remote-debugging-
pipe`), so the browser's network namespace does not matter for control: the executable
handed to Playwright is a two-line wrapper that execs `ip netns exec NS chromium "$@"` (the
PID Playwright holds is Chromium's own, so it stops it as usual). Everything the page does on
the network (HTTP, ICE, DTLS, SRTP) then leaves from inside the namespace.

A page from a plain-HTTP address other than localhost is not a secure context, and there
`navigator.mediaDevices` is missing; `--unsafely-treat-insecure-origin-as-secure` names the
one origin the tests load the page from.

`PAGE_PROBE` measures a call from inside the page (its clock, getStats every 20 ms), so what
a network change cost (`recovery()`: time to the restart request, to audio again, the audio
gap) does not depend on how quickly the test process gets to ask.
"""

from __future__ import annotations

import asyncio
import os
import shlex
import stat
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from playwright.async_api import Browser, Page, async_playwright, expect

from tests.support.chromium import PageLog, chromium_args, chromium_path
from tests.support.netns import AGENT_PUBLIC, NatLab

UI_TIMEOUT_MS = 15_000
MUX_PORT = 40000  # the agent's one --rtc-udp-port (inside its own namespace)
# A longest stall below this (packets every 20 ms, sampled every 20 ms) is ordinary jitter:
# the audio never really stopped.
NO_GAP_MS = 100.0


def namespace_wrapper(namespace: str, folder: Path) -> Path:
    """An executable in `folder` that runs Chromium inside `namespace` with its arguments."""
    executable = chromium_path()
    if executable is None:
        raise RuntimeError("Chromium not found (set CHROMIUM=/path/to/chromium)")
    wrapper = folder / f"chromium-in-{namespace}"
    wrapper.write_text("#!/bin/sh\n"
                       f"exec ip netns exec {shlex.quote(namespace)} "
                       f"{shlex.quote(executable)} \"$@\"\n")
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return wrapper


@asynccontextmanager
async def chromium_in_namespace(namespace: str, audio_file: Path, secure_origin: str,
                                folder: Path) -> AsyncIterator[Browser]:
    """Headless Chromium in `namespace` (the fake microphone plays `audio_file`), treating
    `secure_origin` (e.g. "http://198.51.100.10:8080") as a secure context."""
    wrapper = namespace_wrapper(namespace, folder)
    args = [*chromium_args(audio_file),
            f"--unsafely-treat-insecure-origin-as-secure={secure_origin}"]
    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(
            executable_path=os.fspath(wrapper), args=args, ignore_default_args=["--mute-audio"])
        try:
            yield browser
        finally:
            await browser.close()


# Instruments the page's own RTCPeerConnection (a subclass: the page's code runs unchanged):
# state changes, restartIce() calls and the server events on the page's data channel, with
# the page's clock; and a sampler of the inbound audio's packet count every 20 ms.
PAGE_PROBE = """(() => {
  const Native = window.RTCPeerConnection;
  const lab = { states: [], restarts: [], events: [], samples: [], pc: null };
  window.__lab = lab;
  class Watched extends Native {
    constructor(...args) {
      super(...args);
      lab.pc = this;
      for (const kind of ["connectionstatechange", "iceconnectionstatechange",
                          "icegatheringstatechange"]) {
        this.addEventListener(kind, () => lab.states.push(
          [performance.now(), kind, kind === "connectionstatechange" ? this.connectionState
            : kind === "iceconnectionstatechange" ? this.iceConnectionState
              : this.iceGatheringState]));
      }
    }
    setRemoteDescription(description) {
      lab.states.push([performance.now(), "setRemoteDescription", description.type]);
      return super.setRemoteDescription(description);
    }
    restartIce() {
      lab.restarts.push(performance.now());
      return super.restartIce();
    }
    createDataChannel(...args) {
      const channel = super.createDataChannel(...args);
      channel.addEventListener("message", (event) => {
        try { lab.events.push(JSON.parse(event.data).type); } catch { /* not JSON */ }
      });
      return channel;
    }
  }
  window.RTCPeerConnection = Watched;
  setInterval(async () => {
    const pc = lab.pc;
    if (!pc || pc.connectionState === "closed") return;
    const at = performance.now();
    let report;
    try {
      report = await pc.getStats();
    } catch {
      return; // closed meanwhile
    }
    for (const s of report.values()) {
      if (s.type === "inbound-rtp" && s.kind === "audio") {
        lab.samples.push([at, s.packetsReceived || 0]);
      }
    }
  }, 20);
})();"""


async def open_probed_page(browser: Browser, url: str) -> tuple[Page, PageLog]:
    """The page in a fresh context with PAGE_PROBE installed before its scripts run."""
    context = await browser.new_context()
    await context.add_init_script(PAGE_PROBE)
    page = await context.new_page()
    log = PageLog()
    page.on("console", log.on_console)
    page.on("pageerror", log.on_page_error)
    await page.goto(url)
    return page, log


async def probe(page: Page) -> dict[str, Any]:
    """What PAGE_PROBE recorded so far, and the page's clock now."""
    return await page.evaluate("""() => ({
        now: performance.now(), states: window.__lab.states, restarts: window.__lab.restarts,
        events: window.__lab.events, samples: window.__lab.samples})""")


async def agent_calls(page: Page) -> list[dict[str, Any]]:
    """The agent's /metrics/calls, fetched by the page (from inside the home namespace)."""
    return (await page.evaluate(
        "async () => (await fetch('/metrics/calls')).json()"))["calls"]


async def packets_now(page: Page) -> int:
    """The inbound audio packets the page counted so far."""
    samples = (await probe(page))["samples"]
    return samples[-1][1] if samples else 0


async def wait_for_audio(page: Page, after: int, packets: int = 50,
                         timeout: float = 20.0) -> None:
    """Until `packets` more inbound audio packets than `after` arrived at the page."""
    deadline = time.monotonic() + timeout
    while await packets_now(page) < after + packets:
        if time.monotonic() > deadline:
            raise AssertionError(f"no audio at the page: {await probe(page)}")
        await asyncio.sleep(0.1)


def audio_gap(samples: list[list[float]], since: float) -> tuple[float, float]:
    """The longest span (ms) after `since` in which no inbound packet arrived, and when the
    first packet after it was counted (page clock)."""
    longest, resumed = 0.0, since
    last_change = None
    previous = None
    for at, packets in samples:
        if at < since:
            previous = packets
            last_change = at
            continue
        if previous is not None and packets > previous:
            if last_change is not None and at - last_change > longest:
                longest, resumed = at - last_change, at
            last_change = at
        previous = packets
    return longest, resumed


@dataclass
class Recovery:
    """What a network change cost the call, in ms of the page's clock from the change."""

    restart_request_ms: float | None  # first pc.restartIce() (None: no restart needed)
    audio_again_ms: float  # first packet after the longest stall (0: it never really stopped)
    gap_ms: float  # the longest stall of inbound audio after the change
    states: list[tuple[int, str, str]]

    def line(self) -> str:
        restart = ("no ICE restart" if self.restart_request_ms is None else
                   f"restart requested at {self.restart_request_ms:.0f} ms, audio again "
                   f"{self.audio_again_ms - self.restart_request_ms:.0f} ms after it")
        again = (f"audio again {self.audio_again_ms:.0f} ms after the change"
                 if self.audio_again_ms else "the audio never stopped")
        return f"{restart}; {again}; longest audio gap {self.gap_ms:.0f} ms"


def recovery(info: dict[str, Any], changed: float) -> Recovery:
    """What the change at `changed` (page clock) cost, from the probe's records since."""
    gap, resumed = audio_gap(info["samples"], changed)
    restarts = [at - changed for at in info["restarts"] if at >= changed]
    again = resumed - changed if gap >= NO_GAP_MS else 0.0
    return Recovery(restarts[0] if restarts else None, again, gap,
                    [(round(at - changed), kind, value) for at, kind, value in info["states"]
                     if at >= changed])


async def start_call(lab: NatLab, browser: Browser) -> tuple[Page, PageLog, str]:
    """The agent (one mux port, advertised public address, no STUN) and a connected call
    from the page in the home namespace, its audio flowing; the call's id."""
    await lab.start_agent("--rtc-udp-port", str(MUX_PORT), "--rtc-advertise", AGENT_PUBLIC,
                          "--max-sessions", "2", "--reconnect-seconds", "30")
    page, log = await open_probed_page(browser, lab.public_url + "/")
    await page.click("#call")
    await expect(page.locator("#status")).to_contain_text("Connected", timeout=UI_TIMEOUT_MS)
    await wait_for_audio(page, 0)
    calls = await agent_calls(page)
    assert len(calls) == 1 and calls[0]["connection_state"] == "connected", calls
    assert lab.counter("udp_open") > 0  # through the 1:1 NAT's one open port
    # The answer's only candidate was the public address on the mux port.
    remote = await page.evaluate("window.voiceApp.call.pc.remoteDescription.sdp")
    candidates = [line for line in remote.splitlines() if line.startswith("a=candidate")]
    assert candidates and all(f" {AGENT_PUBLIC} {MUX_PORT} typ host" in c
                              for c in candidates), candidates
    return page, log, calls[0]["call_id"]
