// One Realtime call over WebRTC: offer with an "oai-events" channel, POST it, play the answer.
//
// The agent does not take trickled candidates in the basic flow, so the offer is sent only
// once ICE gathering is complete (or after GATHER_TIMEOUT_MS with what was found by then).

import { httpFailure } from "./failures.js";

export const CALLS_PATH = "/v1/realtime/calls";
const GATHER_TIMEOUT_MS = 3000;

export class CallFailure extends Error {
  constructor({ code, message }) {
    super(message);
    this.code = code;
  }
}

function waitForGathering(pc) {
  if (pc.iceGatheringState === "complete") return Promise.resolve();
  return new Promise((resolve) => {
    const timer = setTimeout(done, GATHER_TIMEOUT_MS);
    function done() {
      clearTimeout(timer);
      pc.removeEventListener("icegatheringstatechange", check);
      resolve();
    }
    function check() {
      if (pc.iceGatheringState === "complete") done();
    }
    pc.addEventListener("icegatheringstatechange", check);
  });
}

async function readBody(response) {
  const text = await response.text();
  try {
    return JSON.parse(text);
  } catch {
    return text;
  }
}

/**
 * Events (EventTarget): "state" (detail: connectionState), "server-event" (detail: parsed
 * event), "track" (detail: MediaStream), "channel-close".
 */
export class VoiceCall extends EventTarget {
  constructor({ baseUrl, iceServers = [], secret = null, session = null }) {
    super();
    this.baseUrl = baseUrl;
    this.iceServers = iceServers;
    this.secret = secret;
    this.session = session;
    this.pc = null;
    this.channel = null;
    this.location = null;
    this.etag = null; // the call resource's ETag: an ICE restart changes it
    this.closed = false;
  }

  #headers(extra = {}) {
    return this.secret ? { ...extra, Authorization: `Bearer ${this.secret}` } : extra;
  }

  /** Negotiate the call with `micTrack` as the caller's audio. Throws CallFailure. */
  async start(micTrack, micStream) {
    const pc = new RTCPeerConnection({ iceServers: this.iceServers });
    this.pc = pc;
    pc.addEventListener("connectionstatechange", () => {
      this.dispatchEvent(new CustomEvent("state", { detail: pc.connectionState }));
    });
    pc.addEventListener("track", (event) => {
      const stream = event.streams[0] ?? new MediaStream([event.track]);
      this.dispatchEvent(new CustomEvent("track", { detail: stream }));
    });
    pc.addTransceiver(micTrack, { direction: "sendrecv", streams: [micStream] });
    // Created before the offer so the SCTP association is negotiated with the audio.
    const channel = pc.createDataChannel("oai-events");
    this.channel = channel;
    channel.addEventListener("message", (event) => this.#onMessage(event.data));
    channel.addEventListener("close", () => {
      if (!this.closed) this.dispatchEvent(new Event("channel-close"));
    });

    await pc.setLocalDescription(await pc.createOffer());
    await waitForGathering(pc);
    if (this.closed) throw new CallFailure({ code: "cancelled", message: "The call was cancelled." });

    const response = await this.#postOffer(pc.localDescription.sdp);
    if (response.status !== 201 && response.status !== 200) {
      const body = await readBody(response);
      throw new CallFailure(httpFailure(response.status, body, response.headers.get("Retry-After")));
    }
    const location = response.headers.get("Location");
    this.location = location ? new URL(location, this.baseUrl).href : null;
    this.etag = response.headers.get("ETag");
    const answer = await response.text();
    if (this.closed) {
      await this.#deleteResource();
      throw new CallFailure({ code: "cancelled", message: "The call was cancelled." });
    }
    await pc.setRemoteDescription({ type: "answer", sdp: answer });
  }

  async #postOffer(sdp) {
    const url = new URL(CALLS_PATH, this.baseUrl).href;
    let body = sdp;
    let headers = this.#headers({ "Content-Type": "application/sdp" });
    if (this.session) {
      // Offer-time config: applied before the first frame, which matters for plugins that
      // cannot change voice or persona once a call runs.
      body = new FormData();
      body.append("sdp", sdp);
      body.append("session", JSON.stringify(this.session));
      headers = this.#headers();
    }
    try {
      return await fetch(url, { method: "POST", headers, body });
    } catch (error) {
      throw new CallFailure({
        code: "server_unreachable",
        message: `The agent could not be reached: ${error.message}`,
      });
    }
  }

  /**
   * ICE restart after a network change (web/restart.js decides when): new ICE credentials in
   * a re-offer POSTed to the call resource; the agent answers with its own, and the call, its
   * conversation and its event channel go on. Throws CallFailure.
   */
  async restartIce() {
    const pc = this.pc;
    if (!pc || !this.location || this.closed) {
      throw new CallFailure({ code: "no_call", message: "There is no call to reconnect." });
    }
    pc.restartIce();
    await pc.setLocalDescription(await pc.createOffer({ iceRestart: true }));
    await waitForGathering(pc);
    const headers = this.#headers({ "Content-Type": "application/sdp" });
    if (this.etag) headers["If-Match"] = this.etag;
    let response;
    try {
      response = await fetch(this.location, {
        method: "POST", headers, body: pc.localDescription.sdp,
      });
    } catch (error) {
      throw new CallFailure({
        code: "server_unreachable",
        message: `The agent could not be reached: ${error.message}`,
      });
    }
    if (response.status !== 200) {
      const body = await readBody(response);
      throw new CallFailure(httpFailure(response.status, body, response.headers.get("Retry-After")));
    }
    this.etag = response.headers.get("ETag") ?? this.etag;
    const answer = await response.text();
    if (this.closed) return;
    await pc.setRemoteDescription({ type: "answer", sdp: answer });
  }

  #onMessage(data) {
    let event;
    try {
      event = JSON.parse(data);
    } catch {
      return; // not ours to judge; the server only sends JSON
    }
    if (event && typeof event.type === "string") {
      this.dispatchEvent(new CustomEvent("server-event", { detail: event }));
    }
  }

  send(event) {
    if (this.channel?.readyState !== "open") return false;
    this.channel.send(JSON.stringify(event));
    return true;
  }

  async #deleteResource() {
    if (!this.location) return null;
    try {
      // keepalive: a hang-up sent as the tab closes (pagehide) still reaches the agent.
      const response = await fetch(this.location, {
        method: "DELETE",
        headers: this.#headers(),
        keepalive: true,
      });
      return response.status;
    } catch {
      return null;
    }
  }

  /** End the call: DELETE the call resource, then close the peer connection. */
  async hangup() {
    if (this.closed) return null;
    this.closed = true;
    const status = await this.#deleteResource();
    this.close();
    return status;
  }

  /** Close locally (the server already ended the call, or it failed). */
  close() {
    this.closed = true;
    try {
      this.channel?.close();
    } catch {
      // already closed
    }
    this.pc?.close();
  }
}
