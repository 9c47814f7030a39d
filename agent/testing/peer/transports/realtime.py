"""The OpenAI-Realtime transport of the headless peer: `POST /v1/realtime/calls`.

The offer goes as `application/sdp`, or as multipart `sdp` + `session` when the call has a
session config (the shape OpenAI's `/v1/realtime/calls` takes); the answer is `201` with the
SDP and a `Location` naming the call. Events travel both ways on the `oai-events` data
channel; `hangup` ends the call with `POST .../{call_id}/hangup` before closing. Everything
else is the WebRTC call's.
"""

from __future__ import annotations

import json
from urllib.parse import urlparse

import aiohttp
from yarl import URL

from agent.testing.peer.transports.base import (
    CONNECT_FAILED,
    REFUSED,
    PeerError,
    PeerOptions,
)
from agent.testing.peer.transports.webrtc import WebRtcCall

CALLS_PATH = "/v1/realtime/calls"


def calls_endpoint(url: str) -> str:
    """A base URL gets the calls path; a URL with a path is taken as the calls endpoint."""
    if urlparse(url).path.rstrip("/"):
        return url.rstrip("/")
    return url.rstrip("/") + CALLS_PATH


class RealtimeCall(WebRtcCall):
    transport = "realtime"

    def __init__(self, url: str, options: PeerOptions | None = None) -> None:
        super().__init__(url, options)
        self._call_url: str | None = None  # the call resource, from the answer's Location

    async def exchange(self, http: aiohttp.ClientSession, sdp: str) -> str:
        endpoint = calls_endpoint(self.url)
        data: aiohttp.FormData | str
        headers = dict(self.headers)
        if self.options.session:
            data = aiohttp.FormData()
            data.add_field("sdp", sdp, content_type="application/sdp")
            data.add_field("session", json.dumps(self.options.session),
                           content_type="application/json")
        else:
            data = sdp
            headers["Content-Type"] = "application/sdp"
        async with http.post(endpoint, data=data, headers=headers) as response:
            text = await response.text()
            if response.status not in (200, 201):
                raise PeerError(REFUSED, f"offer refused: HTTP {response.status} {text[:300]}")
            location = response.headers.get("Location")
        if not location:
            raise PeerError(CONNECT_FAILED, f"{endpoint}: the answer has no Location header")
        self.call_id = location.rstrip("/").rsplit("/", 1)[-1]
        self._call_url = str(response.url.join(URL(location)))
        return text

    async def end_remote(self, remote_ended: bool) -> None:
        """End the call on the server (`POST .../hangup`); closing this side follows."""
        call_url = self._call_url
        if call_url is not None and not remote_ended:
            try:
                async with self.requests().post(
                        call_url + "/hangup", headers=self.headers) as response:
                    await response.read()
            except (aiohttp.ClientError, TimeoutError):
                pass  # the server may already have ended it; closing ends it anyway
