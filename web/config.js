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

/** The agent's own route for ephemeral secrets: the one same-origin token URL the page uses. */
export const CLIENT_SECRETS_PATH = "/v1/realtime/client_secrets";

const LOOPBACK_HOSTS = new Set(["127.0.0.1", "localhost", "[::1]"]);

function parseUrl(text, base) {
  try {
    return new URL(text, base);
  } catch {
    return null;
  }
}

/** An https origin, or an http one on loopback: the only kinds a token URL may live on. */
function safeOrigin(url) {
  return url.protocol === "https:" || (url.protocol === "http:" && LOOPBACK_HOSTS.has(url.hostname));
}

/**
 * `<meta name="token-url-origins" content="...">` (space separated, filled in by the agent
 * from `--token-url-origin`) → the origins as browsers write them; anything else is dropped.
 */
export function parseOriginList(text) {
  const origins = [];
  for (const word of String(text ?? "").split(/\s+/)) {
    const url = word ? parseUrl(word) : null;
    if (url && safeOrigin(url) && !origins.includes(url.origin)) origins.push(url.origin);
  }
  return origins;
}

/** A token URL as the page would request it (resolved against the page), or null. */
export function resolveTokenUrl(text, pageOrigin) {
  return parseUrl(String(text ?? "").trim(), `${pageOrigin}/`);
}

/**
 * Why the page must not send its persona to `text` and take a secret back, or null when it
 * may (or no token URL is set). Accepted: this agent's own `CLIENT_SECRETS_PATH` on the
 * page's origin, or any URL on an origin in `allowedOrigins` (https, or http on loopback).
 * Every other same-origin path (e.g. `/admin/drain`) is refused even if the page's own origin
 * is listed: a POST there would act with the page's standing.
 */
export function tokenUrlProblem(text, pageOrigin, allowedOrigins = []) {
  if (!String(text ?? "").trim()) return null;
  const url = resolveTokenUrl(text, pageOrigin);
  if (!url) return "it is not a valid URL";
  if (url.protocol !== "https:" && url.protocol !== "http:") {
    return `it is a ${url.protocol} URL, not http(s)`;
  }
  if (url.username || url.password) return "it carries a user name or password";
  if (url.origin === pageOrigin) {
    if (url.pathname !== CLIENT_SECRETS_PATH || url.search) {
      return `on this agent's own origin only ${CLIENT_SECRETS_PATH} may be used, not ${url.pathname}${url.search}`;
    }
    return null;
  }
  if (!safeOrigin(url)) return `${url.origin} is neither https nor http on loopback`;
  if (!allowedOrigins.includes(url.origin)) {
    return `${url.origin} is not among the origins this agent allows`;
  }
  return null;
}
