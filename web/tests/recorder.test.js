import { test } from "node:test";
import assert from "node:assert/strict";
import { CallRecording, RECORDING_MODES, encodeWav, floatToInt16, mixDown } from "../recorder.js";

function readWav(buffer) {
  const view = new DataView(buffer);
  const ascii = (o, n) => String.fromCharCode(...new Uint8Array(buffer, o, n));
  const channels = view.getUint16(22, true);
  const dataBytes = view.getUint32(40, true);
  const samples = [];
  for (let o = 44; o < 44 + dataBytes; o += 2) samples.push(view.getInt16(o, true));
  return {
    riff: ascii(0, 4), wave: ascii(8, 4), fmt: ascii(12, 4), data: ascii(36, 4),
    riffSize: view.getUint32(4, true), format: view.getUint16(20, true), channels,
    rate: view.getUint32(24, true), byteRate: view.getUint32(28, true),
    blockAlign: view.getUint16(32, true), bits: view.getUint16(34, true), dataBytes, samples,
    length: buffer.byteLength,
  };
}

test("a stereo WAV has a valid header and interleaved samples", () => {
  const wav = readWav(encodeWav([Float32Array.from([0, 1, -1]), Float32Array.from([0.5, -0.5, 0])], 48000));
  assert.equal(wav.riff, "RIFF");
  assert.equal(wav.wave, "WAVE");
  assert.equal(wav.fmt, "fmt ");
  assert.equal(wav.data, "data");
  assert.equal(wav.format, 1);
  assert.equal(wav.channels, 2);
  assert.equal(wav.rate, 48000);
  assert.equal(wav.byteRate, 48000 * 4);
  assert.equal(wav.blockAlign, 4);
  assert.equal(wav.bits, 16);
  assert.equal(wav.dataBytes, 12);
  assert.equal(wav.riffSize, 36 + 12);
  assert.equal(wav.length, 44 + 12);
  assert.deepEqual(wav.samples, [0, 16384, 32767, -16384, -32768, 0]);
});

test("encodeWav uses the shortest channel and refuses bad input", () => {
  const wav = readWav(encodeWav([new Float32Array(5), new Float32Array(3)], 8000));
  assert.equal(wav.dataBytes, 3 * 4);
  assert.throws(() => encodeWav([], 8000), TypeError);
  assert.throws(() => encodeWav([new Float32Array(1)], 0), RangeError);
  assert.throws(() => encodeWav([new Float32Array(1)], 44100.5), RangeError);
});

test("float to int16 clips and maps non-finite values to zero", () => {
  assert.equal(floatToInt16(2), 32767);
  assert.equal(floatToInt16(-2), -32768);
  assert.equal(floatToInt16(Number.NaN), 0);
  assert.equal(floatToInt16(Infinity), 0);
});

test("mixDown sums both sides and clips", () => {
  assert.deepEqual(Array.from(mixDown(Float32Array.from([0.25, 0.75, -0.9]), Float32Array.from([0.25, 0.5, -0.9]))), [0.5, 1, -1]);
});

test("a recording keeps both sides aligned and renders either mode", () => {
  const r = new CallRecording(4);
  r.append(Float32Array.from([0.5, 0]), Float32Array.from([0, 0.25]));
  r.append(Float32Array.from([0.1]), Float32Array.from([0.1]));
  assert.equal(r.seconds, 0.75);
  const [caller, agent] = r.channels(RECORDING_MODES.stereo);
  assert.deepEqual(Array.from(caller), [0.5, 0, Math.fround(0.1)]);
  assert.deepEqual(Array.from(agent), [0, 0.25, Math.fround(0.1)]);
  const [mixed] = r.channels(RECORDING_MODES.mixed);
  assert.deepEqual(Array.from(mixed), [0.5, 0.25, Math.fround(Math.fround(0.1) + Math.fround(0.1))]);
  assert.equal(readWav(r.toWav("stereo")).channels, 2);
  assert.equal(readWav(r.toWav("mixed")).channels, 1);
  assert.throws(() => r.channels("surround"), RangeError);
});

test("blocks are copied, so a reused capture buffer cannot change the recording", () => {
  const r = new CallRecording(8);
  const block = Float32Array.from([0.5, 0.5]);
  r.append(block, block);
  block.fill(0);
  assert.deepEqual(Array.from(r.channels("stereo")[0]), [0.5, 0.5]);
});

test("the length bound truncates and says so", () => {
  const r = new CallRecording(2, 2); // 4 frames at most
  r.append(new Float32Array(3), new Float32Array(3));
  assert.equal(r.truncated, false);
  r.append(new Float32Array(3), new Float32Array(3));
  assert.equal(r.frames, 4);
  assert.equal(r.truncated, true);
  r.append(new Float32Array(1), new Float32Array(1));
  assert.equal(r.frames, 4);
});

test("mismatched block lengths are refused", () => {
  assert.throws(() => new CallRecording(8).append(new Float32Array(2), new Float32Array(3)), RangeError);
});
