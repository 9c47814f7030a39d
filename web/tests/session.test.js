import { test } from "node:test";
import assert from "node:assert/strict";
import { activeSession, lockedFields, pendingUpdate, sessionFromForm, sessionUpdateEvent } from "../session.js";

test("form → Realtime session shape, null when nothing is chosen", () => {
  assert.deepEqual(sessionFromForm({ voice: "NATF2.pt", instructions: "Be brief." }), {
    type: "realtime", instructions: "Be brief.", audio: { output: { voice: "NATF2.pt" } },
  });
  assert.equal(sessionFromForm({ voice: "", instructions: "   " }), null);
  assert.equal(sessionFromForm({ voice: null, instructions: undefined }), null);
});

test("session.update event", () => {
  assert.deepEqual(sessionUpdateEvent({ instructions: "x" }), {
    type: "session.update", session: { type: "realtime", instructions: "x" },
  });
});

test("locks follow the capabilities, and everything is locked before they are known", () => {
  assert.deepEqual(lockedFields(null), { voice: true, instructions: true });
  assert.deepEqual(lockedFields({ voice_update: true, instructions_update: false }), { voice: false, instructions: true });
  assert.deepEqual(lockedFields({}), { voice: true, instructions: true });
});

test("active session from session.created, either voice spelling", () => {
  const created = { type: "session.created", session: { id: "call_1", voice: "A", instructions: "hi", capabilities: { voice_update: true } } };
  assert.deepEqual(activeSession(created), { id: "call_1", voice: "A", instructions: "hi", capabilities: { voice_update: true } });
  assert.equal(activeSession({ session: { audio: { output: { voice: "B" } } } }).voice, "B");
  assert.deepEqual(activeSession({}), { id: null, voice: null, instructions: null, capabilities: null });
});

test("pending update only for changeable fields that differ", () => {
  const active = { voice: "A", instructions: "hi", capabilities: { voice_update: true, instructions_update: false } };
  assert.deepEqual(pendingUpdate({ voice: "B", instructions: "other" }, active), sessionUpdateEvent({ voice: "B" }));
  assert.equal(pendingUpdate({ voice: "A", instructions: "other" }, active), null);
  const open = { ...active, capabilities: { voice_update: true, instructions_update: true } };
  assert.deepEqual(pendingUpdate({ voice: null, instructions: "other" }, open), sessionUpdateEvent({ instructions: "other" }));
  assert.equal(pendingUpdate({ voice: null, instructions: "" }, open), null);
});
