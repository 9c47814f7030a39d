import { test } from "node:test";
import assert from "node:assert/strict";
import {
  connectionFailure, httpFailure, mediaFailure, serverEnded, sessionError, tokenFailure,
  tokenUrlRefused,
} from "../failures.js";

test("401 and 403 ask for a token URL and pass on the server's words", () => {
  const f = httpFailure(401, { error: { code: "missing_api_key", message: "this server needs a key" } });
  assert.equal(f.code, "auth_required");
  assert.match(f.message, /token URL/);
  assert.match(f.message, /this server needs a key/);
  assert.equal(httpFailure(403, "").code, "auth_required");
});

test("503 says the agent is full and when to retry", () => {
  const f = httpFailure(503, { error: { code: "server_full", message: "all 1 call slots are in use" } }, "5");
  assert.equal(f.code, "server_full");
  assert.match(f.message, /busy/);
  assert.match(f.message, /Try again in 5 s/);
  assert.match(httpFailure(503, null, null).message, /Try again later/);
});

test("other 4xx keep the server's code; 5xx are server errors; 404 names the route", () => {
  const f = httpFailure(400, { error: { code: "no_common_codec", message: "none of the offered codecs" } });
  assert.equal(f.code, "no_common_codec");
  assert.match(f.message, /none of the offered codecs/);
  assert.equal(httpFailure(415, "nope").code, "call_refused");
  assert.equal(httpFailure(500, null).code, "server_error");
  assert.match(httpFailure(404, null).message, /\/v1\/realtime\/calls/);
});

test("token failures distinguish unreachable, refused and empty", () => {
  assert.equal(tokenFailure(0, null).code, "token_unreachable");
  assert.equal(tokenFailure(200, {}).code, "token_invalid");
  const refused = tokenFailure(403, { error: { message: "not logged in" } });
  assert.equal(refused.code, "token_refused");
  assert.match(refused.message, /not logged in/);
});

test("microphone errors map to what the person can do", () => {
  assert.equal(mediaFailure({ name: "NotAllowedError" }).code, "mic_permission_denied");
  assert.match(mediaFailure({ name: "NotAllowedError" }).message, /permission/i);
  assert.equal(mediaFailure({ name: "NotFoundError" }).code, "mic_not_found");
  assert.equal(mediaFailure({ name: "NotReadableError" }).code, "mic_busy");
  assert.match(mediaFailure({ name: "TypeError" }).message, /https or localhost/);
  assert.equal(mediaFailure(undefined).code, "mic_unavailable");
});

test("connection and server-side endings", () => {
  assert.equal(connectionFailure("failed").code, "ice_failed");
  assert.match(connectionFailure("failed").message, /TURN/);
  assert.equal(connectionFailure("closed").code, "connection_lost");
  assert.equal(connectionFailure("timeout").code, "connect_timeout");
  assert.match(connectionFailure("timeout").message, /TURN/);
  assert.match(serverEnded("max_call_seconds").message, /time limit/);
  assert.match(serverEnded("max_call_seconds", "calls are limited to 2 s").message, /limited to 2 s/);
  assert.equal(serverEnded().message, "The agent ended the call.");
  assert.equal(serverEnded("unheard-of").code, "ended_by_server");
});

test("error events keep their code", () => {
  const f = sessionError({ type: "error", error: { code: "voice_update_unsupported", message: "cannot change" } });
  assert.equal(f.code, "voice_update_unsupported");
  assert.match(f.message, /cannot change/);
  assert.equal(sessionError({ type: "error" }).code, "session_error");
});

test("a refused token URL says why and names the flag that allows an origin", () => {
  const f = tokenUrlRefused("/admin/drain", "on this agent's own origin only /v1/realtime/client_secrets may be used, not /admin/drain");
  assert.equal(f.code, "token_url_refused");
  assert.match(f.message, /"\/admin\/drain" was not used: on this agent's own origin/);
  assert.match(f.message, /--token-url-origin ORIGIN/);
  const long = tokenUrlRefused(`https://evil.example/${"x".repeat(500)}`, "no");
  assert.ok(long.message.length < 400);
  assert.match(long.message, /…" was not used/);
});
