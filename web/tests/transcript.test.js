import { test } from "node:test";
import assert from "node:assert/strict";
import { Transcript } from "../transcript.js";

const delta = (id, text) => ({ type: "response.output_audio_transcript.delta", response_id: id, item_id: id, delta: text });
const done = (id, transcript) => ({ type: "response.output_audio_transcript.done", response_id: id, item_id: id, transcript });

test("deltas of one response join into one entry", () => {
  const t = new Transcript();
  assert.equal(t.apply(delta("r1", "Hel")), true);
  assert.equal(t.apply(delta("r1", "lo")), true);
  assert.deepEqual(t.entries.map((e) => [e.text, e.done]), [["Hello", false]]);
});

test("separate responses make separate entries in arrival order", () => {
  const t = new Transcript();
  t.apply(delta("r1", "one"));
  t.apply(delta("r2", "two"));
  t.apply(delta("r1", "!"));
  assert.equal(t.text, "one!\ntwo");
});

test("done replaces the assembled text with the server's and closes the entry", () => {
  const t = new Transcript();
  t.apply(delta("r1", "Helo"));
  assert.equal(t.apply(done("r1", "Hello")), true);
  assert.deepEqual(t.entries[0], { id: "r1", text: "Hello", done: true, interrupted: false });
  assert.equal(t.text, "Hello");
});

test("a delta after done under the same id starts the next segment", () => {
  const t = new Transcript();
  t.apply(delta("r1", "First."));
  t.apply(done("r1", "First."));
  assert.equal(t.apply(delta("r1", "Second")), true);
  t.apply(delta("r1", " one."));
  assert.deepEqual(t.entries.map((e) => [e.text, e.done]), [["First.", true], ["Second one.", false]]);
  t.apply(done("r1", "Second one."));
  assert.equal(t.text, "First.\nSecond one.");
});

test("done without deltas still shows its text; an empty done without deltas is ignored", () => {
  const t = new Transcript();
  assert.equal(t.apply({ type: "response.output_audio_transcript.done", response_id: "r9" }), false);
  assert.equal(t.apply(done("r3", "whole")), true);
  assert.equal(t.text, "whole");
});

test("events without item_id fall back to response_id", () => {
  const t = new Transcript();
  t.apply({ type: "response.output_audio_transcript.delta", response_id: "r1", delta: "a" });
  t.apply({ type: "response.output_audio_transcript.delta", response_id: "r1", delta: "b" });
  assert.equal(t.text, "ab");
});

test("a cleared buffer marks the live entry interrupted", () => {
  const t = new Transcript();
  t.apply(delta("r1", "I was say"));
  assert.equal(t.apply({ type: "output_audio_buffer.cleared", response_id: "r1" }), true);
  assert.equal(t.entries[0].interrupted, true);
  assert.equal(t.apply({ type: "output_audio_buffer.cleared", response_id: "r1" }), false);
});

test("other and malformed events change nothing", () => {
  const t = new Transcript();
  for (const event of [null, {}, { type: 5 }, { type: "session.created" }, delta("r1", ""), { ...delta("r1", "x"), delta: 7 }]) {
    assert.equal(t.apply(event), false);
  }
  assert.equal(t.entries.length, 0);
});

test("the transcript keeps only the newest entries", () => {
  const t = new Transcript(3);
  for (let i = 0; i < 5; i += 1) t.apply(delta(`r${i}`, `w${i}`));
  assert.equal(t.text, "w2\nw3\nw4");
  assert.equal(t.apply(delta("r0", "again")), true, "an evicted id starts a fresh entry");
  assert.equal(t.entries.length, 3);
});

test("clear empties it", () => {
  const t = new Transcript();
  t.apply(delta("r1", "x"));
  t.clear();
  assert.equal(t.text, "");
  assert.equal(t.entries.length, 0);
});
