"""Headless Debian Chromium for the page tests (tests/web/) and the browser benchmark
(benchmarks/browser_call_bench.py). Needs Playwright (the `test` extra).

A fake microphone plays a WAV file the caller names (looped by Chromium); the permission
prompt is answered yes (or no, with `allow_microphone=False`); audio output is not muted, so
received WebRTC audio is decoded and played like in a real tab.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

from playwright.async_api import Browser, ConsoleMessage, Page, ViewportSize, async_playwright

CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")


def chromium_path() -> str | None:
    return CHROMIUM if Path(CHROMIUM).exists() else shutil.which("chromium")


def chromium_args(audio_file: Path, allow_microphone: bool = True) -> list[str]:
    args = [
        "--no-sandbox",
        "--use-fake-device-for-media-stream",
        f"--use-file-for-fake-audio-capture={audio_file}",
        "--autoplay-policy=no-user-gesture-required",
        "--disable-background-networking",
    ]
    # Answer the permission prompt yes, or (to test the refusal) no.
    args.append(
        "--use-fake-ui-for-media-stream" if allow_microphone else "--deny-permission-prompts"
    )
    return args


@asynccontextmanager
async def launch_chromium(audio_file: Path, *, allow_microphone: bool = True
                          ) -> AsyncIterator[Browser]:
    executable = chromium_path()
    if executable is None:
        raise RuntimeError("Chromium not found (set CHROMIUM=/path/to/chromium)")
    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(
            executable_path=executable,
            args=chromium_args(audio_file, allow_microphone),
            ignore_default_args=["--mute-audio"],
        )
        try:
            yield browser
        finally:
            await browser.close()


@dataclass
class PageLog:
    """Console errors and uncaught exceptions seen by a page."""

    console_errors: list[str] = field(default_factory=list)
    page_errors: list[str] = field(default_factory=list)

    def on_console(self, message: ConsoleMessage) -> None:
        if message.type == "error":
            self.console_errors.append(message.text)

    def on_page_error(self, error: Exception) -> None:
        self.page_errors.append(str(error))


async def open_page(browser: Browser, url: str, *, viewport: ViewportSize | None = None
                    ) -> tuple[Page, PageLog]:
    context = await browser.new_context(viewport=viewport or {"width": 1100, "height": 900},
                                        accept_downloads=True)
    page = await context.new_page()
    log = PageLog()
    page.on("console", log.on_console)
    page.on("pageerror", log.on_page_error)
    await page.goto(url)
    return page, log
