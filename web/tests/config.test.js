import { test } from "node:test";
import assert from "node:assert/strict";
import {
  CLIENT_SECRETS_PATH, parseIceServers, parseModels, parseOriginList, resolveTokenUrl,
  secretFromTokenResponse, settingsFromQuery, tokenUrlProblem,
} from "../config.js";

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

const PAGE = "http://127.0.0.1:8080";
const ALLOWED = ["https://app.example", "http://127.0.0.1:9000"];

test("token URL: the agent's own client_secrets route, relative or absolute", () => {
  assert.equal(CLIENT_SECRETS_PATH, "/v1/realtime/client_secrets");
  for (const url of [
    "/v1/realtime/client_secrets",
    "v1/realtime/client_secrets",
    " /v1/realtime/client_secrets ",
    "http://127.0.0.1:8080/v1/realtime/client_secrets",
    "HTTP://127.0.0.1:8080/v1/realtime/client_secrets#x",
  ]) {
    assert.equal(tokenUrlProblem(url, PAGE, []), null, url);
  }
  assert.equal(tokenUrlProblem("", PAGE, []), null); // none set
  assert.equal(tokenUrlProblem(null, PAGE, []), null);
  assert.equal(resolveTokenUrl("v1/realtime/client_secrets", PAGE).href,
    "http://127.0.0.1:8080/v1/realtime/client_secrets");
});

test("token URL: any other path on the page's origin is refused, even when the origin is listed", () => {
  for (const url of [
    "/admin/drain",
    "/v1/realtime/calls",
    "/v1/realtime/client_secrets/../../admin/drain",
    "/v1/realtime/%2e%2e/%2e%2e/admin/drain",
    "/v1/realtime/client_secrets?x=1",
    "/v1/realtime/client_secrets/",
    "http://127.0.0.1:8080/admin/drain",
  ]) {
    const reason = tokenUrlProblem(url, PAGE, [PAGE]);
    assert.match(reason ?? "", /only \/v1\/realtime\/client_secrets/, url);
  }
});

test("token URL: foreign origins only when allowed, and only https or loopback http", () => {
  assert.equal(tokenUrlProblem("https://app.example/token", PAGE, ALLOWED), null);
  assert.equal(tokenUrlProblem("https://APP.example:443/mint?x=1", PAGE, ALLOWED), null);
  assert.equal(tokenUrlProblem("http://127.0.0.1:9000/token", PAGE, ALLOWED), null);
  assert.match(tokenUrlProblem("https://other.example/token", PAGE, ALLOWED),
    /https:\/\/other\.example is not among the origins/);
  assert.match(tokenUrlProblem("//evil.example/token", PAGE, ALLOWED), /http:\/\/evil\.example/);
  assert.match(tokenUrlProblem("http://127.0.0.1:9001/token", PAGE, ALLOWED), /not among/);
  assert.match(tokenUrlProblem("https://app.example:8443/token", PAGE, ALLOWED), /not among/);
  // http off loopback is refused even if a page somehow lists it.
  assert.match(tokenUrlProblem("http://app.example/token", PAGE, ["http://app.example"]),
    /neither https nor http on loopback/);
  assert.match(tokenUrlProblem("https://u:p@app.example/token", PAGE, ALLOWED), /user name/);
  assert.match(tokenUrlProblem("javascript:alert(1)", PAGE, ALLOWED), /javascript: URL/);
  assert.match(tokenUrlProblem("data:text/plain,ek_1", PAGE, ALLOWED), /data: URL/);
  assert.match(tokenUrlProblem("http://[::1", PAGE, ALLOWED), /not a valid URL/);
});

test("allowed origins from the page's meta tag", () => {
  assert.deepEqual(parseOriginList("https://app.example  http://127.0.0.1:9000 https://app.example"),
    ["https://app.example", "http://127.0.0.1:9000"]);
  assert.deepEqual(parseOriginList("HTTPS://App.Example:443/ http://[::1]:5 http://localhost:7"),
    ["https://app.example", "http://[::1]:5", "http://localhost:7"]);
  assert.deepEqual(parseOriginList("http://evil.example javascript:x nonsense"), []);
  assert.deepEqual(parseOriginList(""), []);
  assert.deepEqual(parseOriginList(undefined), []);
});
