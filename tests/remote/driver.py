"""Drive a remote plugin the way the ticker does, without WebRTC: prepare on the loop, create
and step on a worker thread, one frame at a time."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from agent.plugins.base import SessionConfig, StepOutput
from agent.plugins.remote.plugin import RemotePlugin, RemoteSession

FRAME = 1920


class Driver:
    def __init__(self, plugin: RemotePlugin) -> None:
        self.plugin = plugin
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="test-ticker")

    async def _in_worker(self, fn: Callable[..., object], *args: object) -> object:
        return await asyncio.get_running_loop().run_in_executor(self.executor, fn, *args)

    async def open(self, config: SessionConfig | None = None) -> RemoteSession:
        runtime = await self.plugin.prepare_runtime_config(config or SessionConfig())
        session = await self._in_worker(self.plugin.create_session, runtime)
        assert isinstance(session, RemoteSession)
        return session

    async def step(self, session: RemoteSession, frame: np.ndarray) -> StepOutput:
        outputs = await self._in_worker(self.plugin.step, [(session, frame)])
        assert isinstance(outputs, list)
        return outputs[0]

    async def run_until(
        self, session: RemoteSession, done: Callable[[list[StepOutput]], bool],
        signal: np.ndarray | None = None, timeout: float = 15.0, period: float = 0.02,
    ) -> list[StepOutput]:
        """Step frames of `signal` (then silence) until `done(outputs)` or the deadline."""
        outputs: list[StepOutput] = []
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        index = 0
        while not done(outputs):
            if loop.time() > deadline:
                raise AssertionError(f"not done after {len(outputs)} frames")
            frame = np.zeros(FRAME, dtype=np.float32)
            if signal is not None and (index + 1) * FRAME <= len(signal):
                frame = signal[index * FRAME : (index + 1) * FRAME]
            index += 1
            outputs.append(await self.step(session, frame))
            await asyncio.sleep(period)
        return outputs

    async def close(self, session: RemoteSession) -> None:
        await self._in_worker(self.plugin.close_session, session)

    async def shutdown(self) -> None:
        await self.plugin.close()
        self.executor.shutdown(wait=True)


def upstream_tasks() -> list[asyncio.Task[object]]:
    return [t for t in asyncio.all_tasks() if (t.get_name() or "").startswith("upstream:")]


def failed_with(outputs: list[StepOutput]) -> StepOutput | None:
    return next((o for o in outputs if o.end_call), None)


def loud(output: StepOutput) -> bool:
    return bool(np.abs(output.audio).max() > 1e-3)
