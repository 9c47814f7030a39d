// What the page learns from the server and the address bar, parsed defensively: a server
// without the discovery routes, or with a different shape, leaves the page working with
// defaults rather than broken.

/** `?token_url=` (and `?voice=`, `?instructions=`) from the page address. */
export function settingsFromQuery(search) {
  const params = new URLSearchParams(search ?? "");
  const text = (name) => {
    const value = params.get(name);
    return value && value.trim() ? value.trim() : null;
  };
  return {
    tokenUrl: text("token_url"),
    voice: text("voice"),
    instructions: params.get("instructions"),
  };
}

function stringList(value) {
  return Array.isArray(value) ? value.filter((v) => typeof v === "string" && v) : [];
}

/**
 * `GET /v1/models` (OpenAI list shape) → the plugin this agent serves and what it offers.
 * Voices and capabilities may sit on the model or under `capabilities`.
 */
export function parseModels(json) {
  const models = Array.isArray(json?.data) ? json.data.filter((m) => m && typeof m === "object") : [];
  const model = models[0] ?? null;
  if (!model) return null;
  const caps = model.capabilities && typeof model.capabilities === "object" ? model.capabilities : {};
  const voices = stringList(model.voices).length ? stringList(model.voices) : stringList(caps.voices);
  const pick = (name) => (model[name] !== undefined ? model[name] : caps[name]);
  const flag = (name) => (typeof pick(name) === "boolean" ? pick(name) : null);
  const text = (name) => (typeof pick(name) === "string" ? pick(name) : null);
  return {
    id: typeof model.id === "string" ? model.id : "agent",
    voices,
    defaultVoice: text("default_voice"),
    defaultInstructions: text("default_instructions"),
    voiceUpdate: flag("voice_update"),
    instructionsUpdate: flag("instructions_update"),
  };
}

function iceServer(entry) {
  if (!entry || typeof entry !== "object") return null;
  const urls = entry.urls ?? entry.url;
  const list = typeof urls === "string" ? [urls] : stringList(urls);
  if (!list.length) return null;
  const server = { urls: list };
  if (typeof entry.username === "string") server.username = entry.username;
  if (typeof entry.credential === "string") server.credential = entry.credential;
  return server;
}

/** `GET /v1/realtime/config` → RTCIceServer[] for the page's peer connection. */
export function parseIceServers(json) {
  const entries = json?.ice_servers ?? json?.iceServers ?? [];
  return Array.isArray(entries) ? entries.map(iceServer).filter(Boolean) : [];
}

/**
 * A token URL's answer → the ephemeral secret. Accepts the agent's own shape
 * (`{"value": "ek_..."}`), OpenAI's older `{"client_secret": {"value": ...}}`, or plain text.
 */
export function secretFromTokenResponse(body) {
  if (typeof body === "string") {
    const text = body.trim();
    return text && !text.startsWith("{") && !/\s/.test(text) ? text : null;
  }
  if (!body || typeof body !== "object") return null;
  if (typeof body.value === "string" && body.value) return body.value;
  const nested = body.client_secret;
  if (typeof nested === "string" && nested) return nested;
  if (nested && typeof nested.value === "string" && nested.value) return nested.value;
  return null;
}
