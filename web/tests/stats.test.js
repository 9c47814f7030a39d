import { test } from "node:test";
import assert from "node:assert/strict";
import { formatStats, summarizeStats } from "../stats.js";

// The shapes below are copied from what Chromium 156 reports for a call to the agent.
const report = (over = {}) => [
  { id: "T01", type: "transport", selectedCandidatePairId: "CP1" },
  { id: "CP1", type: "candidate-pair", nominated: true, state: "succeeded", currentRoundTripTime: 0.004 },
  { id: "CP2", type: "candidate-pair", nominated: false, state: "failed", currentRoundTripTime: 9 },
  { id: "CIT01_111", type: "codec", mimeType: "audio/opus", clockRate: 48000, channels: 2 },
  {
    id: "IT01", type: "inbound-rtp", kind: "audio", codecId: "CIT01_111", jitter: 0.0025,
    packetsLost: 3, packetsReceived: 297, bytesReceived: 15041, audioLevel: 0.12,
    jitterBufferDelay: 4800, jitterBufferEmittedCount: 96000, ...over,
  },
  { id: "OT01", type: "outbound-rtp", kind: "audio", codecId: "CIT01_111", bytesSent: 20000 },
];

test("summary picks the selected pair, the audio inbound stream and its codec", () => {
  const s = summarizeStats(report());
  assert.equal(s.codec, "opus 48 kHz");
  assert.equal(s.rttMs, 4);
  assert.equal(s.jitterMs, 2.5);
  assert.equal(s.packetsLost, 3);
  assert.equal(s.bytesReceived, 15041);
  assert.equal(s.bytesSent, 20000);
  assert.equal(s.audioLevel, 0.12);
  assert.equal(s.playoutDelayMs, 50); // 4800 sample-seconds over 96000 samples
});

test("playout delay uses only what was emitted since the previous poll", () => {
  const first = summarizeStats(report());
  const second = summarizeStats(report({ jitterBufferDelay: 4800 + 48000 * 0.02, jitterBufferEmittedCount: 144000 }), first);
  assert.ok(Math.abs(second.playoutDelayMs - 20) < 1e-9);
});

test("RTT falls back to remote-inbound-rtp, then to nothing", () => {
  const noPair = report().filter((s) => s.type !== "transport" && s.type !== "candidate-pair");
  assert.equal(summarizeStats([...noPair, { type: "remote-inbound-rtp", id: "R", roundTripTime: 0.03 }]).rttMs, 30);
  assert.equal(summarizeStats(noPair).rttMs, null);
});

test("Firefox's selected pair wins when there is no transport entry", () => {
  const stats = report().filter((s) => s.type !== "transport").map((s) =>
    s.id === "CP2" ? { ...s, selected: true, currentRoundTripTime: 0.012 } : s);
  assert.equal(summarizeStats(stats).rttMs, 12);
});

test("a nominated succeeded pair is used when the transport names none", () => {
  const stats = report().filter((s) => s.type !== "transport");
  assert.equal(summarizeStats(stats).rttMs, 4);
});

test("an empty report gives nulls, and formatting shows dashes", () => {
  const s = summarizeStats([]);
  assert.equal(s.codec, null);
  assert.equal(s.playoutDelayMs, null);
  const rows = Object.fromEntries(formatStats(s, "new"));
  assert.equal(rows.State, "new");
  assert.equal(rows["Round trip"], "—");
  assert.equal(rows["Packets lost"], "—");
  const none = Object.fromEntries(formatStats(null, ""));
  assert.equal(none.State, "—");
  assert.equal(none.Codec, "—");
});

test("formatting: one decimal under 10 ms, whole ms above", () => {
  const rows = Object.fromEntries(formatStats({ ...summarizeStats([]), rttMs: 0.34, jitterMs: 12.6 }, "connected"));
  assert.equal(rows["Round trip"], "0.3 ms");
  assert.equal(rows.Jitter, "13 ms");
});

test("formatting rounds milliseconds and shows loss as a percentage", () => {
  const rows = Object.fromEntries(formatStats(summarizeStats(report()), "connected"));
  assert.deepEqual(rows, {
    State: "connected",
    Codec: "opus 48 kHz",
    "Round trip": "4.0 ms",
    Jitter: "2.5 ms",
    "Packets lost": "3 (1.0 %)",
    "Playout delay": "50 ms",
    Received: "15.0 kB",
  });
});

test("video streams are not taken for audio", () => {
  const stats = [{ id: "V", type: "inbound-rtp", kind: "video", bytesReceived: 1 }];
  assert.equal(summarizeStats(stats).bytesReceived, null);
});
