// The page's Web Audio graph: level meters for both sides, and the call recorder's capture.
//
//   mic stream ──► analyser (input meter) ──► merger input 0 ─┐
//   agent stream ─► analyser (output meter) ─► merger input 1 ─┴─► capture worklet ─► (mute) ─► out
//
// The agent's audio is *played* by an <audio> element; Web Audio only listens to it (and
// Chromium only feeds a remote WebRTC stream into Web Audio while an element plays it).

import { rms, toDbfs, meterFraction } from "./levels.js";

const WORKLET_URL = new URL("./recorder-worklet.js", import.meta.url);

export class AudioGraph {
  constructor() {
    this.context = new AudioContext();
    this.micAnalyser = this.#analyser();
    this.agentAnalyser = this.#analyser();
    this.micSource = null;
    this.agentSource = null;
    this.capture = null;
    this.onCapture = null; // (caller: Float32Array, agent: Float32Array) => void
    this.block = new Float32Array(this.micAnalyser.fftSize);
  }

  #analyser() {
    const node = this.context.createAnalyser();
    node.fftSize = 2048;
    node.smoothingTimeConstant = 0;
    return node;
  }

  async resume() {
    if (this.context.state === "suspended") await this.context.resume();
  }

  setMicStream(stream) {
    this.micSource?.disconnect();
    this.micSource = stream ? this.context.createMediaStreamSource(stream) : null;
    this.micSource?.connect(this.micAnalyser);
    if (this.micSource && this.capture) this.micSource.connect(this.capture, 0, 0);
  }

  setAgentStream(stream) {
    this.agentSource?.disconnect();
    this.agentSource = stream ? this.context.createMediaStreamSource(stream) : null;
    this.agentSource?.connect(this.agentAnalyser);
    if (this.agentSource && this.capture) this.agentSource.connect(this.capture, 0, 1);
  }

  /** Meter fill in [0, 1] for "mic" or "agent", from the latest 2048 samples. */
  level(side) {
    const analyser = side === "mic" ? this.micAnalyser : this.agentAnalyser;
    const source = side === "mic" ? this.micSource : this.agentSource;
    if (!source) return 0;
    analyser.getFloatTimeDomainData(this.block);
    return meterFraction(toDbfs(rms(this.block)));
  }

  /** Start delivering aligned caller/agent blocks to `onCapture`. */
  async startCapture(onCapture) {
    await this.context.audioWorklet.addModule(WORKLET_URL);
    const node = new AudioWorkletNode(this.context, "call-capture", {
      numberOfInputs: 2,
      numberOfOutputs: 1,
      outputChannelCount: [1],
      channelCount: 1,
      channelCountMode: "explicit",
      channelInterpretation: "speakers",
    });
    node.port.onmessage = (event) => onCapture(event.data.caller, event.data.agent);
    // A node only renders while something downstream pulls it; a silent gain does that
    // without adding the recording to what the speakers play.
    const mute = this.context.createGain();
    mute.gain.value = 0;
    node.connect(mute).connect(this.context.destination);
    this.capture = node;
    this.captureMute = mute;
    this.micSource?.connect(node, 0, 0);
    this.agentSource?.connect(node, 0, 1);
  }

  /** Stop capturing; resolves once the worklet's last partial batch has been delivered. */
  async stopCapture() {
    const node = this.capture;
    if (!node) return;
    this.capture = null;
    await new Promise((resolve) => {
      const previous = node.port.onmessage;
      const timer = setTimeout(resolve, 500);
      node.port.onmessage = (event) => {
        previous(event);
        clearTimeout(timer);
        resolve();
      };
      node.port.postMessage("flush");
    });
    for (const source of [this.micSource, this.agentSource]) {
      try {
        source?.disconnect(node);
      } catch {
        // that source was replaced after capture started and was never connected to `node`
      }
    }
    node.disconnect();
    this.captureMute.disconnect();
  }

  get sampleRate() {
    return this.context.sampleRate;
  }

  async close() {
    await this.context.close();
  }
}
