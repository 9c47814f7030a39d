import { test } from "node:test";
import assert from "node:assert/strict";
import { parseIceServers, parseModels, secretFromTokenResponse, settingsFromQuery } from "../config.js";

test("query settings", () => {
  assert.deepEqual(settingsFromQuery("?token_url=%2Ftoken&voice=NATF2.pt"), {
    tokenUrl: "/token", voice: "NATF2.pt", instructions: null,
  });
  assert.deepEqual(settingsFromQuery(""), { tokenUrl: null, voice: null, instructions: null });
  assert.equal(settingsFromQuery("?token_url=%20%20").tokenUrl, null);
});

test("models: voices and capabilities on the model or under capabilities", () => {
  const flat = parseModels({ object: "list", data: [{ id: "personaplex", voices: ["A.pt", "B.pt"], default_voice: "A.pt", voice_update: false }] });
  assert.deepEqual(flat, {
    id: "personaplex", voices: ["A.pt", "B.pt"], defaultVoice: "A.pt", defaultInstructions: null,
    voiceUpdate: false, instructionsUpdate: null,
  });
  const nested = parseModels({ data: [{ id: "echo", capabilities: { voices: [], instructions_update: true } }] });
  assert.deepEqual(nested.voices, []);
  assert.equal(nested.instructionsUpdate, true);
  assert.equal(parseModels({ data: [] }), null);
  assert.equal(parseModels(null), null);
  assert.deepEqual(parseModels({ data: [{ voices: ["ok", 3, ""] }] }).voices, ["ok"]);
});

test("ICE servers from either spelling; junk dropped", () => {
  assert.deepEqual(parseIceServers({ ice_servers: [
    { urls: ["turn:127.0.0.1:3478?transport=udp"], username: "u", credential: "p" },
    { urls: "stun:stun.example" },
    { url: "stun:legacy.example" },
    { urls: [] },
    "nonsense",
  ] }), [
    { urls: ["turn:127.0.0.1:3478?transport=udp"], username: "u", credential: "p" },
    { urls: ["stun:stun.example"] },
    { urls: ["stun:legacy.example"] },
  ]);
  assert.deepEqual(parseIceServers({ iceServers: [{ urls: "stun:a" }] }), [{ urls: ["stun:a"] }]);
  assert.deepEqual(parseIceServers(null), []);
  assert.deepEqual(parseIceServers({ ice_servers: "x" }), []);
});

test("secrets from the agent's, OpenAI's and plain-text token answers", () => {
  assert.equal(secretFromTokenResponse({ value: "ek_1", expires_at: 9 }), "ek_1");
  assert.equal(secretFromTokenResponse({ client_secret: { value: "ek_2" } }), "ek_2");
  assert.equal(secretFromTokenResponse({ client_secret: "ek_3" }), "ek_3");
  assert.equal(secretFromTokenResponse(" ek_4\n"), "ek_4");
  assert.equal(secretFromTokenResponse("<html> error page"), null);
  assert.equal(secretFromTokenResponse("{broken json"), null);
  assert.equal(secretFromTokenResponse({}), null);
  assert.equal(secretFromTokenResponse(null), null);
});
