"""The baseline: a plain aiortc echo server (aiortc examples style, no framing, no pacing).

`POST /offer` JSON in, JSON answer out; the caller's track is sent straight back.
ICE host candidates on 127.0.0.1 only, like the agent in the benchmarks.
"""

from __future__ import annotations

import argparse
import asyncio

from aiohttp import web
from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription
from aiortc.contrib.media import MediaRelay

from agent.rtc_tuning import limit_host_addresses

peers: set[RTCPeerConnection] = set()
relay = MediaRelay()


async def offer(request: web.Request) -> web.Response:
    params = await request.json()
    pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    peers.add(pc)

    @pc.on("connectionstatechange")
    async def on_state() -> None:
        if pc.connectionState in ("failed", "closed"):
            peers.discard(pc)
            await pc.close()

    @pc.on("track")
    def on_track(track) -> None:  # type: ignore[no-untyped-def]
        pc.addTrack(relay.subscribe(track))

    await pc.setRemoteDescription(RTCSessionDescription(params["sdp"], params["type"]))
    await pc.setLocalDescription(await pc.createAnswer())
    return web.json_response({"sdp": pc.localDescription.sdp, "type": "answer"})


async def on_shutdown(app: web.Application) -> None:
    await asyncio.gather(*(pc.close() for pc in list(peers)))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=8081)
    args = parser.parse_args()
    limit_host_addresses(["127.0.0.1"])
    app = web.Application()
    app.router.add_post("/offer", offer)
    app.on_shutdown.append(on_shutdown)
    web.run_app(app, host="127.0.0.1", port=args.port, print=None)


if __name__ == "__main__":
    main()
