// Call recording in the page: both sides, sample-aligned, saved as a 16-bit PCM WAV.
//
// The capture itself (an AudioWorklet fed by a two-input channel merger: microphone left,
// agent right) lives in recorder-worklet.js and app.js; this module holds the buffers and the
// WAV encoding so they can be tested without a browser.

export const RECORDING_MODES = Object.freeze({
  mixed: "mixed", // one channel: caller + agent summed
  stereo: "stereo", // two channels: left = caller, right = agent
});

/** Float32 [-1, 1] channels → a RIFF/WAVE PCM s16le file (ArrayBuffer), interleaved. */
export function encodeWav(channels, sampleRate) {
  if (!Array.isArray(channels) || channels.length === 0) {
    throw new TypeError("encodeWav needs at least one channel");
  }
  if (!Number.isInteger(sampleRate) || sampleRate <= 0) {
    throw new RangeError("sampleRate must be a positive integer");
  }
  const frames = Math.min(...channels.map((c) => c.length));
  const channelCount = channels.length;
  const blockAlign = channelCount * 2;
  const dataBytes = frames * blockAlign;
  const buffer = new ArrayBuffer(44 + dataBytes);
  const view = new DataView(buffer);
  const ascii = (offset, text) => {
    for (let i = 0; i < text.length; i += 1) view.setUint8(offset + i, text.charCodeAt(i));
  };
  ascii(0, "RIFF");
  view.setUint32(4, 36 + dataBytes, true);
  ascii(8, "WAVE");
  ascii(12, "fmt ");
  view.setUint32(16, 16, true); // fmt chunk size
  view.setUint16(20, 1, true); // PCM
  view.setUint16(22, channelCount, true);
  view.setUint32(24, sampleRate, true);
  view.setUint32(28, sampleRate * blockAlign, true);
  view.setUint16(32, blockAlign, true);
  view.setUint16(34, 16, true);
  ascii(36, "data");
  view.setUint32(40, dataBytes, true);
  let offset = 44;
  for (let i = 0; i < frames; i += 1) {
    for (let c = 0; c < channelCount; c += 1) {
      view.setInt16(offset, floatToInt16(channels[c][i]), true);
      offset += 2;
    }
  }
  return buffer;
}

export function floatToInt16(sample) {
  const clamped = Math.max(-1, Math.min(1, Number.isFinite(sample) ? sample : 0));
  return clamped < 0 ? Math.round(clamped * 0x8000) : Math.round(clamped * 0x7fff);
}

/** Caller + agent summed into one channel (clipped, not scaled: each side keeps its level). */
export function mixDown(left, right) {
  const length = Math.min(left.length, right.length);
  const mixed = new Float32Array(length);
  for (let i = 0; i < length; i += 1) {
    mixed[i] = Math.max(-1, Math.min(1, left[i] + right[i]));
  }
  return mixed;
}

function concat(chunks, length) {
  const out = new Float32Array(length);
  let offset = 0;
  for (const chunk of chunks) {
    out.set(chunk, offset);
    offset += chunk.length;
  }
  return out;
}

/**
 * Two aligned tracks (caller, agent) collected in chunks, bounded by `maxSeconds` so a
 * forgotten recording cannot eat the tab's memory; past the bound new audio is dropped and
 * `truncated` says so.
 */
export class CallRecording {
  constructor(sampleRate, maxSeconds = 30 * 60) {
    this.sampleRate = sampleRate;
    this.maxFrames = Math.floor(sampleRate * maxSeconds);
    this.callerChunks = [];
    this.agentChunks = [];
    this.frames = 0;
    this.truncated = false;
  }

  /** Append one block; both sides must be the same length (one worklet block). */
  append(caller, agent) {
    if (caller.length !== agent.length) {
      throw new RangeError("caller and agent blocks must have the same length");
    }
    const room = this.maxFrames - this.frames;
    if (room <= 0) {
      this.truncated = this.truncated || caller.length > 0;
      return;
    }
    const take = Math.min(room, caller.length);
    if (take < caller.length) this.truncated = true;
    this.callerChunks.push(Float32Array.from(caller.subarray(0, take)));
    this.agentChunks.push(Float32Array.from(agent.subarray(0, take)));
    this.frames += take;
  }

  get seconds() {
    return this.frames / this.sampleRate;
  }

  channels(mode) {
    const caller = concat(this.callerChunks, this.frames);
    const agent = concat(this.agentChunks, this.frames);
    if (mode === RECORDING_MODES.stereo) return [caller, agent];
    if (mode === RECORDING_MODES.mixed) return [mixDown(caller, agent)];
    throw new RangeError(`unknown recording mode '${mode}'`);
  }

  toWav(mode) {
    return encodeWav(this.channels(mode), this.sampleRate);
  }
}
