"""A GStreamer webrtcbin caller for the interop tests; run with the system Python (PyGObject).

    /usr/bin/python3 gst_webrtc_caller.py URL IN.wav OUT.raw --codec opus|pcmu --seconds N

Sends IN.wav to `POST URL/v1/realtime/calls` with webrtcbin's defaults (its own RSA DTLS
certificate, non-trickle offer once gathering completes), records what comes back to OUT.raw
(48 kHz mono s16le, no header: a header needs an EOS that can stall a failed pipeline) and
prints one JSON report: connect time, states, data-channel events.

The WAV plays from when the connection is up, not from when the pipeline starts: a blocking
probe on the pacing `identity sync=true` lets its first buffer through (a few tens of ms: the
encoder's caps follow it to webrtcbin, which needs them for its offer) and holds the next until
`connected`, when identity's `ts-offset` becomes that moment's running time, so the rest plays
in real time from there rather than all that is overdue at once. Played from the pipeline's
start, the part before a slow connect (seconds on a loaded machine) was lost, and with a fixed
recording length the recording could end past the end of the signal: nothing of the signal left
to align it with.

Kept free of the project's imports: it runs outside the project's interpreter.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
import urllib.parse
import urllib.request
from typing import Any

import gi

gi.require_version("Gst", "1.0")
gi.require_version("GstSdp", "1.0")
gi.require_version("GstWebRTC", "1.0")
from gi.repository import GLib, Gst, GstSdp, GstWebRTC  # noqa: E402

ENCODERS = {
    "opus": "opusenc ! rtpopuspay pt=111 ! "
            "application/x-rtp,media=audio,encoding-name=OPUS,payload=111",
    "pcmu": "mulawenc ! rtppcmupay pt=0 ! "
            "application/x-rtp,media=audio,encoding-name=PCMU,payload=0",
}


class Caller:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.loop = GLib.MainLoop()
        self.report: dict[str, Any] = {"connected": False, "events": [], "errors": []}
        self.started = time.monotonic()
        self.pipeline = Gst.parse_launch(
            f"webrtcbin name=webrtc bundle-policy=max-bundle "
            f"filesrc location={args.input} ! wavparse ! identity name=pace sync=true ! "
            f"audioconvert ! "
            f"audioresample ! "
            f"audio/x-raw,channels=1 ! {ENCODERS[args.codec]} ! queue ! webrtc."
        )
        self.webrtc = self.pipeline.get_by_name("webrtc")
        self.pace = self.pipeline.get_by_name("pace")
        self.source = self.pace.get_static_pad("sink")
        self.buffers_let_through = 0
        self.held: int | None = self.source.add_probe(
            Gst.PadProbeType.BLOCK | Gst.PadProbeType.BUFFER | Gst.PadProbeType.BUFFER_LIST,
            self.hold_after_the_first)
        self.webrtc.connect("on-negotiation-needed", self.on_negotiation_needed)
        self.webrtc.connect("pad-added", self.on_pad_added)
        self.webrtc.connect("notify::ice-gathering-state", self.on_gathering)
        self.webrtc.connect("notify::connection-state", self.on_connection_state)
        self.offer_posted = False
        self.location: str | None = None
        bus = self.pipeline.get_bus()
        bus.add_signal_watch()
        bus.connect("message::error", self.on_bus_error)

    def run(self) -> dict[str, Any]:
        self.pipeline.set_state(Gst.State.PLAYING)
        channel = self.webrtc.emit("create-data-channel", "oai-events", None)
        if channel is not None:
            channel.connect("on-message-string", self.on_channel_message)
        GLib.timeout_add(int(self.args.timeout * 1000), self.finish, "timeout")
        self.loop.run()
        self.pipeline.set_state(Gst.State.NULL)
        return self.report

    def finish(self, why: str) -> bool:
        self.report.setdefault("ended", why)
        if self.location:
            self.hang_up(self.location)
        self.loop.quit()
        return False

    def hang_up(self, location: str) -> None:
        url = urllib.parse.urljoin(self.args.url.rstrip("/") + "/", location)
        try:
            with urllib.request.urlopen(
                urllib.request.Request(url, method="DELETE"), timeout=10
            ) as response:
                self.report["hangup_status"] = response.status
        except Exception as error:
            self.report["errors"].append(f"hangup: {error}")

    def hold_after_the_first(self, _pad: Gst.Pad, _info: Gst.PadProbeInfo
                             ) -> Gst.PadProbeReturn:
        """PASS: this buffer goes, the probe blocks on the next; OK: blocked here."""
        if self.buffers_let_through == 0:
            self.buffers_let_through = 1
            return Gst.PadProbeReturn.PASS
        return Gst.PadProbeReturn.OK

    def play_from_now(self) -> None:
        """Let the held WAV go, its timestamps starting at the pipeline's running time now."""
        if self.held is None:
            return
        clock = self.pipeline.get_clock()
        if clock is not None:
            self.pace.set_property("ts-offset", clock.get_time() - self.pipeline.get_base_time())
        self.source.remove_probe(self.held)
        self.held = None
        self.report["played_at"] = round(time.monotonic() - self.started, 3)

    def on_bus_error(self, _bus: Gst.Bus, message: Gst.Message) -> None:
        error, debug = message.parse_error()
        self.report["errors"].append(f"{error.message} ({debug})")
        self.finish("pipeline_error")

    def on_negotiation_needed(self, element: Gst.Element) -> None:
        promise = Gst.Promise.new_with_change_func(self.on_offer_created, element, None)
        element.emit("create-offer", None, promise)

    def on_offer_created(self, promise: Gst.Promise, element: Gst.Element, _: Any) -> None:
        reply = promise.get_reply()
        offer = reply.get_value("offer") if reply is not None and reply.has_field("offer") else None
        if offer is None:
            self.report["errors"].append(f"create-offer: {reply.to_string() if reply else None}")
            GLib.idle_add(self.finish, "no_offer")
            return
        element.emit("set-local-description", offer, Gst.Promise.new())

    def on_gathering(self, element: Gst.Element, _spec: Any) -> None:
        state = element.get_property("ice-gathering-state")
        if state == GstWebRTC.WebRTCICEGatheringState.COMPLETE and not self.offer_posted:
            self.offer_posted = True
            sdp = element.get_property("local-description").sdp.as_text()
            threading.Thread(target=self.post_offer, args=(sdp,), daemon=True).start()

    def post_offer(self, sdp: str) -> None:
        time.sleep(self.args.offer_delay)  # a slow connect, as on a loaded machine
        request = urllib.request.Request(
            self.args.url.rstrip("/") + "/v1/realtime/calls", data=sdp.encode(),
            headers={"Content-Type": "application/sdp"}, method="POST",
        )
        try:
            with urllib.request.urlopen(request, timeout=20) as response:
                self.report["http_status"] = response.status
                self.location = response.headers.get("Location")
                answer = response.read().decode()
        except Exception as error:  # report it; the test reads the report
            self.report["errors"].append(f"offer: {error}")
            GLib.idle_add(self.finish, "offer_refused")
            return
        GLib.idle_add(self.apply_answer, answer)

    def apply_answer(self, answer: str) -> bool:
        _, message = GstSdp.SDPMessage.new_from_text(answer)
        description = GstWebRTC.WebRTCSessionDescription.new(
            GstWebRTC.WebRTCSDPType.ANSWER, message
        )
        self.webrtc.emit("set-remote-description", description, Gst.Promise.new())
        return False

    def on_connection_state(self, element: Gst.Element, _spec: Any) -> None:
        state = element.get_property("connection-state")
        name = state.value_nick
        self.report.setdefault("states", []).append(name)
        if state == GstWebRTC.WebRTCPeerConnectionState.CONNECTED and not self.report["connected"]:
            self.report["connected"] = True
            self.report["connect_seconds"] = round(time.monotonic() - self.started, 3)
            self.play_from_now()
            GLib.timeout_add(int(self.args.seconds * 1000), self.finish, "done")
        elif state == GstWebRTC.WebRTCPeerConnectionState.FAILED:
            GLib.idle_add(self.finish, "connection_failed")

    def on_channel_message(self, _channel: Any, text: str) -> None:
        try:
            self.report["events"].append(json.loads(text).get("type"))
        except ValueError:
            self.report["events"].append("<not json>")

    def on_pad_added(self, _element: Gst.Element, pad: Gst.Pad) -> None:
        if pad.get_direction() != Gst.PadDirection.SRC:
            return
        decoder = Gst.ElementFactory.make("decodebin")
        decoder.connect("pad-added", self.on_decoded_pad)
        self.pipeline.add(decoder)
        decoder.sync_state_with_parent()
        pad.link(decoder.get_static_pad("sink"))

    def on_decoded_pad(self, _decoder: Gst.Element, pad: Gst.Pad) -> None:
        recorder = Gst.parse_bin_from_description(
            "audioconvert ! audioresample ! audio/x-raw,format=S16LE,rate=48000,channels=1 ! "
            f"filesink location={self.args.output}",
            True,
        )
        self.pipeline.add(recorder)
        recorder.sync_state_with_parent()
        result = pad.link(recorder.get_static_pad("sink"))
        if result != Gst.PadLinkReturn.OK:
            self.report["errors"].append(f"link decoded audio: {result.value_nick}")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("input")
    parser.add_argument("output")
    parser.add_argument("--codec", choices=sorted(ENCODERS), default="opus")
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--timeout", type=float, default=30.0)
    parser.add_argument("--offer-delay", type=float, default=0.0,
                        help="seconds to wait before posting the offer (a slow connect)")
    args = parser.parse_args()
    Gst.init(None)
    report = Caller(args).run()
    print(json.dumps(report))
    return 0 if report["connected"] else 1


if __name__ == "__main__":
    sys.exit(main())
