// The voice-call page: wires the form, the call, the audio graph and the panels together.

import { AudioGraph } from "./audio-graph.js";
import { CallFailure, VoiceCall } from "./call.js";
import { IceRecovery } from "./restart.js";
import {
  parseIceServers,
  parseModels,
  parseOriginList,
  resolveTokenUrl,
  secretFromTokenResponse,
  settingsFromQuery,
  tokenUrlProblem,
} from "./config.js";
import {
  connectionFailure,
  httpFailure,
  mediaFailure,
  serverEnded,
  sessionError,
  tokenFailure,
  tokenUrlRefused,
} from "./failures.js";
import { MeterBallistics } from "./levels.js";
import { CallRecording, RECORDING_MODES } from "./recorder.js";
import { activeSession, lockedFields, pendingUpdate, sessionFromForm } from "./session.js";
import { formatStats, summarizeStats } from "./stats.js";
import { Transcript } from "./transcript.js";

const STATS_INTERVAL_MS = 1000;
// Chromium declares ICE failed after about 15-20 s of unanswered checks; this catches the
// cases where it never starts checking (no usable remote candidate) and waits forever.
const CONNECT_TIMEOUT_MS = 30_000;
const $ = (id) => document.getElementById(id);

const ui = {
  agentInfo: $("agent-info"),
  call: $("call"),
  hangup: $("hangup"),
  status: $("status"),
  error: $("error"),
  inputLevel: $("input-level"),
  outputLevel: $("output-level"),
  transcript: $("transcript"),
  mic: $("mic"),
  voice: $("voice"),
  voiceNote: $("voice-note"),
  persona: $("persona"),
  personaNote: $("persona-note"),
  applySession: $("apply-session"),
  echoCancellation: $("echo-cancellation"),
  noiseSuppression: $("noise-suppression"),
  autoGain: $("auto-gain"),
  tokenUrl: $("token-url"),
  tokenOrigins: $("token-origins"),
  loadVoices: $("load-voices"),
  connectionDetails: $("connection-details"),
  recordMode: $("record-mode"),
  record: $("record"),
  download: $("download"),
  recordStatus: $("record-status"),
  stats: $("stats"),
  audio: $("agent-audio"),
};

const state = {
  phase: "idle", // idle | starting | connected | ending
  call: null,
  recovery: null, // restarts ICE when a connected call's network changes (restart.js)
  micStream: null,
  graph: null,
  model: null, // what GET /v1/models said, if anything
  needsAuth: false, // GET /v1/models said 401/403: voices need a secret from the token URL
  // Where a token URL may live besides this agent's own client_secrets route: filled in by
  // the agent from --token-url-origin (signaling/page.py).
  tokenOrigins: parseOriginList(document.querySelector('meta[name="token-url-origins"]')?.content),
  active: null, // what session.created / session.updated said
  endReason: null, // from a call.ending event
  transcript: new Transcript(),
  statsTimer: null,
  connectTimer: null,
  lastStats: null,
  meterFrame: null,
  recording: null,
  recordingUrl: null,
  timings: {},
};

const meters = { mic: new MeterBallistics(), agent: new MeterBallistics() };

// -- messages -------------------------------------------------------------------------------

function setStatus(text) {
  ui.status.textContent = text;
}

function showError(failure) {
  ui.error.textContent = failure.message;
  ui.error.dataset.code = failure.code;
  ui.error.hidden = false;
}

function clearError() {
  ui.error.hidden = true;
  ui.error.textContent = "";
  delete ui.error.dataset.code;
}

// -- server discovery -----------------------------------------------------------------------

function authHeaders(secret) {
  return secret ? { Authorization: `Bearer ${secret}` } : {};
}

async function getJson(path, secret) {
  const response = await fetch(path, { headers: authHeaders(secret) });
  let body = null;
  try {
    body = await response.json();
  } catch {
    body = null;
  }
  return { status: response.status, body };
}

// -- the token URL --------------------------------------------------------------------------

/** Why the token URL in the field must not be used, as a failure to show; null when it may. */
function tokenUrlRefusal() {
  const text = ui.tokenUrl.value.trim();
  const problem = tokenUrlProblem(text, location.origin, state.tokenOrigins);
  return problem ? tokenUrlRefused(text, problem) : null;
}

/** The token URL to POST to, null when none is set; a refused one throws before any request. */
function acceptedTokenUrl() {
  const text = ui.tokenUrl.value.trim();
  if (!text) return null;
  const refusal = tokenUrlRefusal();
  if (refusal) throw new CallFailure(refusal);
  return resolveTokenUrl(text, location.origin).href;
}

/** Only ever called from a user action (Call, Load voices): never on load or on typing. */
async function fetchSecret(session) {
  const url = acceptedTokenUrl();
  if (!url) return null;
  let response;
  try {
    response = await fetch(url, {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify(session ? { session } : {}),
      redirect: "error", // the accepted URL answers itself; it may not send the persona on
    });
  } catch {
    throw new CallFailure(tokenFailure(0, null));
  }
  const text = await response.text();
  let body = text;
  try {
    body = JSON.parse(text);
  } catch {
    // plain-text secrets are allowed
  }
  if (!response.ok) throw new CallFailure(tokenFailure(response.status, body));
  const secret = secretFromTokenResponse(body);
  if (!secret) throw new CallFailure(tokenFailure(200, body));
  return secret;
}

function describeModel(model) {
  if (!model) return "Agent ready.";
  const parts = [`Agent: ${model.id}`];
  if (model.voices.length) parts.push(`${model.voices.length} voice${model.voices.length > 1 ? "s" : ""}`);
  return parts.join(" · ");
}

function fillVoices(model) {
  const keep = ui.voice.value;
  ui.voice.replaceChildren(new Option("Agent's default", ""));
  for (const voice of model?.voices ?? []) {
    const label = voice === model.defaultVoice ? `${voice} (default)` : voice;
    ui.voice.add(new Option(label, voice));
  }
  const wanted = settingsFromQuery(location.search).voice ?? keep;
  if (wanted && [...ui.voice.options].some((o) => o.value === wanted)) ui.voice.value = wanted;
  if (!model?.voices.length) {
    ui.voiceNote.textContent = "This agent offers no voices to choose from.";
    ui.voiceNote.hidden = false;
  } else {
    ui.voiceNote.hidden = true;
  }
  if (model?.defaultInstructions && !ui.persona.value) ui.persona.placeholder = model.defaultInstructions;
  updateFieldLocks();
}

function renderAgentInfo() {
  const tokenUrl = ui.tokenUrl.value.trim();
  const refused = tokenUrlRefusal() !== null;
  let text;
  if (!state.needsAuth) {
    text = state.model ? describeModel(state.model) : "Agent ready (it does not list its voices).";
  } else if (!tokenUrl) {
    text = "This agent needs authorization: set a token URL under Settings.";
  } else if (refused) {
    text = "This agent needs authorization, and the token URL set was refused (see the message under Call).";
  } else {
    text = "This agent needs authorization: the token URL will be used when you press Call.";
  }
  ui.agentInfo.textContent = text;
  ui.loadVoices.hidden = !(state.needsAuth && tokenUrl && !refused);
}

/**
 * `GET /v1/models`: without a secret on load (the token URL is never asked then); with one
 * once a user action (Call, Load voices) fetched it, so a keyed agent lists its voices.
 */
async function loadServerInfo(secret = null) {
  try {
    const result = await getJson("/v1/models", secret);
    state.needsAuth = result.status === 401 || result.status === 403;
    state.model = result.status === 200 ? parseModels(result.body) : null;
  } catch {
    state.needsAuth = false;
    state.model = null;
  }
  renderAgentInfo();
  fillVoices(state.model);
}

/** Load voices: a user gesture. The secret is never called with; it just expires. */
async function loadVoicesWithToken() {
  if (state.phase !== "idle") return;
  clearError();
  ui.loadVoices.disabled = true;
  try {
    await loadServerInfo(await fetchSecret(null));
  } catch (error) {
    showError(error instanceof CallFailure ? error : tokenFailure(0, null));
  } finally {
    ui.loadVoices.disabled = state.phase !== "idle";
  }
}

/** A new token URL is checked, and the refusal shown, without any request. */
function onTokenUrlChange() {
  if (ui.error.dataset.code === "token_url_refused") clearError();
  const refusal = tokenUrlRefusal();
  if (refusal) showError(refusal);
  renderAgentInfo();
}

function showTokenOrigins() {
  ui.tokenOrigins.textContent = `Origins this agent allows: ${state.tokenOrigins.join(", ")}.`;
  ui.tokenOrigins.hidden = !state.tokenOrigins.length;
}

async function iceServers(secret) {
  try {
    const result = await getJson("/v1/realtime/config", secret);
    return result.status === 200 ? parseIceServers(result.body) : [];
  } catch {
    return []; // host candidates still work on a LAN or loopback
  }
}

// -- microphone -----------------------------------------------------------------------------

function micConstraints() {
  const audio = {
    echoCancellation: ui.echoCancellation.checked,
    noiseSuppression: ui.noiseSuppression.checked,
    autoGainControl: ui.autoGain.checked,
    channelCount: 1,
  };
  if (ui.mic.value) audio.deviceId = { exact: ui.mic.value };
  return { audio, video: false };
}

async function refreshMicrophones() {
  if (!navigator.mediaDevices?.enumerateDevices) return;
  const devices = await navigator.mediaDevices.enumerateDevices();
  const inputs = devices.filter((d) => d.kind === "audioinput" && d.deviceId && d.deviceId !== "default");
  const selected = ui.mic.value;
  ui.mic.replaceChildren(new Option("Default microphone", ""));
  inputs.forEach((device, index) => {
    ui.mic.add(new Option(device.label || `Microphone ${index + 1}`, device.deviceId));
  });
  if ([...ui.mic.options].some((o) => o.value === selected)) ui.mic.value = selected;
}

async function openMicrophone() {
  if (!navigator.mediaDevices?.getUserMedia) {
    throw new CallFailure(mediaFailure({ name: "TypeError", message: "" }));
  }
  try {
    return await navigator.mediaDevices.getUserMedia(micConstraints());
  } catch (error) {
    throw new CallFailure(mediaFailure(error));
  }
}

/** Mid-call microphone or processing change: a fresh track replaces the sent one. */
async function reopenMicrophone() {
  if (state.phase !== "connected" || !state.call?.pc) return;
  const sender = state.call.pc.getSenders().find((s) => s.track?.kind === "audio" || s.track === null);
  // Chromium hands a second capture of an open device the first one's processing, so the
  // old track must stop before the new settings can take effect (a brief gap in the audio).
  state.micStream?.getTracks().forEach((t) => t.stop());
  let stream;
  try {
    stream = await openMicrophone();
  } catch (failure) {
    state.micStream = null;
    state.graph?.setMicStream(null);
    await sender?.replaceTrack(null);
    showError(failure);
    setStatus("Connected, but without a microphone.");
    return;
  }
  await sender?.replaceTrack(stream.getAudioTracks()[0]);
  state.micStream = stream;
  state.graph?.setMicStream(stream);
  setStatus("Connected. Microphone settings applied.");
}

// -- the call -------------------------------------------------------------------------------

function setPhase(phase) {
  state.phase = phase;
  document.body.dataset.phase = phase;
  const inCall = phase !== "idle";
  ui.call.disabled = inCall;
  ui.hangup.disabled = !inCall || phase === "ending";
  ui.record.disabled = phase !== "connected";
  ui.tokenUrl.disabled = inCall;
  ui.loadVoices.disabled = inCall;
  updateFieldLocks();
}

function updateFieldLocks() {
  const inCall = state.phase !== "idle";
  const locks = inCall ? lockedFields(state.active?.capabilities) : { voice: false, instructions: false };
  const noVoices = !state.model?.voices.length;
  ui.voice.disabled = locks.voice || noVoices;
  ui.persona.disabled = locks.instructions;
  const lockedNote = "Locked: this agent cannot change it during a call.";
  if (inCall && state.active && locks.instructions) {
    ui.personaNote.textContent = lockedNote;
    ui.personaNote.hidden = false;
  } else {
    ui.personaNote.hidden = true;
  }
  if (inCall && state.active && locks.voice && !noVoices) {
    ui.voiceNote.textContent = lockedNote;
    ui.voiceNote.hidden = false;
  } else if (!noVoices) {
    ui.voiceNote.hidden = true;
  }
  ui.applySession.hidden = !(state.phase === "connected" && state.active && (!locks.voice || !locks.instructions));
}

function formFields() {
  return { voice: ui.voice.value || null, instructions: ui.persona.value };
}

async function startCall() {
  if (state.phase !== "idle") return;
  clearError();
  const refusal = tokenUrlRefusal();
  if (refusal) {
    showError(refusal); // before the microphone and before any request
    setStatus("Call not started.");
    return;
  }
  state.timings = { pressedAt: performance.now() };
  state.endReason = null;
  state.active = null;
  state.transcript.clear();
  renderTranscript();
  setPhase("starting");
  ui.hangup.focus();
  try {
    state.graph ??= new AudioGraph();
    // Not awaited: a browser that holds the context until a "real" gesture (Firefox under
    // automation) must not hold up the call; the graph only feeds meters and recording.
    state.graph.resume().catch(() => {});
    setStatus("Opening the microphone…");
    const micStream = await openMicrophone();
    if (state.phase !== "starting") {
      // Hung up while the permission prompt was open: give the microphone straight back.
      micStream.getTracks().forEach((t) => t.stop());
      return;
    }
    state.micStream = micStream;
    refreshMicrophones().catch(() => {});
    state.graph.setMicStream(state.micStream);
    startMeters();
    const session = sessionFromForm(formFields());
    let secret = null;
    if (ui.tokenUrl.value.trim()) {
      setStatus("Getting a call token…");
      secret = await fetchSecret(session);
      // The agent would not list its voices without a secret: now it can, for the next call.
      if (state.needsAuth && secret) await loadServerInfo(secret);
    }
    const servers = await iceServers(secret);
    if (state.phase !== "starting") return;
    setStatus("Connecting…");
    const call = new VoiceCall({ baseUrl: location.href, iceServers: servers, secret, session });
    state.call = call;
    state.recovery?.stop();
    state.recovery = new IceRecovery({
      restart: () => call.restartIce(),
      report: (step, detail) => onRecovery(call, step, detail),
    });
    ui.status.dataset.iceRestarts = "0";
    call.addEventListener("state", (event) => onConnectionState(call, event.detail));
    call.addEventListener("track", (event) => onAgentStream(event.detail));
    call.addEventListener("server-event", (event) => onServerEvent(event.detail));
    call.addEventListener("channel-close", () => onServerGone(call));
    await call.start(state.micStream.getAudioTracks()[0], state.micStream);
    if (call === state.call) state.recovery?.watchInbound(() => call.pc);
    state.timings.answeredAt = performance.now();
    startStatsPolling();
    state.connectTimer = setTimeout(() => {
      if (call === state.call && state.phase === "starting") {
        showError(connectionFailure("timeout"));
        finishCall("Call failed.", { release: true });
      }
    }, CONNECT_TIMEOUT_MS);
  } catch (error) {
    if (state.phase === "idle") return; // hung up while starting
    const failure = error instanceof CallFailure
      ? error
      : { code: "call_failed", message: `The call could not start: ${error?.message ?? error}` };
    showError(failure);
    await finishCall(failure.code === "server_full" ? "Busy." : "Call failed.", { release: true });
  }
}

function onConnectionState(call, connectionState) {
  if (call !== state.call) return;
  const recovering = state.recovery?.onState(connectionState) ?? false;
  if (connectionState === "connected") {
    state.timings.connectedAt ??= performance.now();
    if (state.phase === "starting") setPhase("connected");
    setStatus(state.recovery?.restarts ? "Reconnected: the call goes on."
      : "Connected. Talk to the agent.");
    pollStats().catch(() => {}); // show the connected numbers now, not at the next tick
  } else if (connectionState === "disconnected") {
    setStatus("Connection interrupted; waiting for it to recover…");
  } else if (connectionState === "failed") {
    if (recovering && !state.endReason) {
      setStatus("Network changed: reconnecting the call…");
      return;
    }
    if (state.endReason) {
      onServerGone(call);
      return;
    }
    showError(connectionFailure("failed"));
    finishCall("Call failed.", { release: true });
  } else if (connectionState === "closed" && !call.closed) {
    onServerGone(call);
  }
}

function onRecovery(call, step, detail) {
  if (call !== state.call) return;
  if (step === "restarting") {
    ui.status.dataset.iceRestarts = String(state.recovery?.restarts ?? 0);
    setStatus(`Network changed: reconnecting the call (attempt ${detail})…`);
  } else if (step === "recovered") {
    setStatus("Reconnected: the call goes on.");
  } else if (step === "restart-failed") {
    const reason = detail?.code ?? detail?.message ?? detail;
    setStatus(`Reconnecting failed (${reason}); trying again if the connection stays down…`);
  }
}

function onServerGone(call) {
  if (call !== state.call || call.closed) return;
  showError(serverEnded(state.endReason?.reason, state.endReason?.message));
  finishCall("Call ended by the agent.");
}

function onAgentStream(stream) {
  ui.audio.srcObject = stream;
  ui.audio.play().catch(() => {
    setStatus("Connected, but the browser blocked playback: click anywhere on the page.");
  });
  state.graph?.setAgentStream(stream);
}

function onServerEvent(event) {
  if (state.transcript.apply(event)) renderTranscript();
  switch (event.type) {
    case "session.created":
    case "session.updated": {
      state.active = activeSession(event);
      updateFieldLocks();
      if (event.type === "session.created") {
        const update = pendingUpdate(formFields(), state.active);
        if (update) state.call?.send(update);
      } else {
        setStatus("Connected. Session updated.");
      }
      break;
    }
    case "output_audio_buffer.started":
      state.timings.firstAgentSpeechEventAt ??= performance.now();
      break;
    case "call.ending":
      state.endReason = { reason: event.reason ?? null, message: event.message ?? null };
      break;
    case "error":
      if (event.error?.code === "session_expired") {
        // OpenAI's hard-end notice; the close that follows is explained by serverEnded.
        state.endReason ??= { reason: "max_call_seconds", message: event.error.message ?? null };
      } else {
        showError(sessionError(event));
      }
      break;
    default:
      break;
  }
}

async function hangUp() {
  if (state.phase === "idle" || state.phase === "ending") return;
  const call = state.call;
  setPhase("ending");
  setStatus("Hanging up…");
  let deleteStatus = null;
  if (call) deleteStatus = await call.hangup();
  if (deleteStatus !== null && deleteStatus >= 400 && deleteStatus !== 404) {
    // The peer connection is closed either way; the server ends a call whose media stops.
    showError(httpFailure(deleteStatus, null));
  }
  await finishCall("Call ended.");
}

/**
 * Tear down the page side of a call. `release` also DELETEs the call resource (the call
 * failed on our side, so the agent may still hold its slot); a call the agent ended is
 * only closed here.
 */
async function finishCall(statusText, { release = false } = {}) {
  const call = state.call;
  state.call = null;
  state.recovery?.stop();
  state.recovery = null;
  clearTimeout(state.connectTimer);
  state.connectTimer = null;
  if (release) call?.hangup();
  call?.close();
  stopStatsPolling();
  if (state.recording && state.graph?.capture) await stopRecording();
  state.micStream?.getTracks().forEach((t) => t.stop());
  state.micStream = null;
  state.graph?.setMicStream(null);
  state.graph?.setAgentStream(null);
  ui.audio.srcObject = null;
  stopMeters();
  state.active = null;
  setPhase("idle");
  setStatus(statusText);
  if (document.activeElement === ui.hangup || document.activeElement === document.body) ui.call.focus();
}

// -- panels ---------------------------------------------------------------------------------

function renderTranscript() {
  const entries = state.transcript.entries;
  if (!entries.length) {
    ui.transcript.replaceChildren(Object.assign(document.createElement("p"), {
      className: "muted placeholder",
      textContent: "What the agent says appears here.",
    }));
    return;
  }
  const nodes = entries.map((entry) => {
    const p = document.createElement("p");
    p.textContent = entry.text;
    p.className = entry.interrupted ? "interrupted" : entry.done ? "" : "live";
    return p;
  });
  ui.transcript.replaceChildren(...nodes);
  ui.transcript.scrollTop = ui.transcript.scrollHeight;
}

function renderStats(summary, connectionState) {
  const rows = formatStats(summary, connectionState);
  const nodes = [];
  for (const [label, value] of rows) {
    const dt = document.createElement("dt");
    dt.textContent = label;
    const dd = document.createElement("dd");
    dd.textContent = value;
    dd.dataset.stat = label.toLowerCase().replace(/\s+/g, "-");
    nodes.push(dt, dd);
  }
  ui.stats.replaceChildren(...nodes);
}

async function pollStats() {
  const pc = state.call?.pc;
  if (!pc) return;
  const report = await pc.getStats();
  const summary = summarizeStats([...report.values()], state.lastStats);
  state.lastStats = summary;
  if (summary.bytesReceived > 0) state.timings.firstBytesAt ??= performance.now();
  renderStats(summary, pc.connectionState);
}

function startStatsPolling() {
  stopStatsPolling();
  state.lastStats = null;
  pollStats().catch(() => {});
  state.statsTimer = setInterval(() => pollStats().catch(() => {}), STATS_INTERVAL_MS);
}

function stopStatsPolling() {
  if (state.statsTimer !== null) clearInterval(state.statsTimer);
  state.statsTimer = null;
  renderStats(state.lastStats, "closed");
}

function startMeters() {
  if (state.meterFrame !== null) return;
  const tick = (now) => {
    const seconds = now / 1000;
    const graph = state.graph;
    ui.inputLevel.value = meters.mic.update(graph ? graph.level("mic") : 0, seconds);
    const agentLevel = graph ? graph.level("agent") : 0;
    if (agentLevel > 0.2) state.timings.firstAgentAudioAt ??= performance.now();
    ui.outputLevel.value = meters.agent.update(agentLevel, seconds);
    state.meterFrame = requestAnimationFrame(tick);
  };
  state.meterFrame = requestAnimationFrame(tick);
}

function stopMeters() {
  if (state.meterFrame !== null) cancelAnimationFrame(state.meterFrame);
  state.meterFrame = null;
  ui.inputLevel.value = 0;
  ui.outputLevel.value = 0;
}

// -- recording ------------------------------------------------------------------------------

async function startRecording() {
  if (!state.graph || state.phase !== "connected") return;
  await Promise.race([state.graph.resume(), new Promise((resolve) => setTimeout(resolve, 1000))]);
  if (state.graph.context.state !== "running") {
    throw new Error("the browser has not started audio processing for this page " +
      "(no audio output device, or audio is blocked for this site)");
  }
  state.recording = new CallRecording(state.graph.sampleRate);
  const recording = state.recording;
  await state.graph.startCapture((caller, agent) => recording.append(caller, agent));
  ui.record.textContent = "Stop recording";
  ui.record.setAttribute("aria-pressed", "true");
  ui.recordStatus.textContent = "Recording both sides…";
}

async function stopRecording() {
  await state.graph?.stopCapture();
  ui.record.textContent = "Start recording";
  ui.record.setAttribute("aria-pressed", "false");
  publishRecording();
}

function publishRecording() {
  const recording = state.recording;
  if (!recording) return;
  if (state.recordingUrl) URL.revokeObjectURL(state.recordingUrl);
  const mode = ui.recordMode.value === RECORDING_MODES.stereo ? RECORDING_MODES.stereo : RECORDING_MODES.mixed;
  const blob = new Blob([recording.toWav(mode)], { type: "audio/wav" });
  state.recordingUrl = URL.createObjectURL(blob);
  const stamp = new Date().toISOString().slice(0, 19).replace(/[:T]/g, "-");
  ui.download.href = state.recordingUrl;
  ui.download.download = `call-${stamp}-${mode}.wav`;
  ui.download.hidden = false;
  ui.recordStatus.textContent =
    `Recorded ${recording.seconds.toFixed(1)} s (${mode === "stereo" ? "two channels" : "mixed"}).` +
    (recording.truncated ? " The recording hit its length limit." : "");
}

async function toggleRecording() {
  ui.record.disabled = true;
  try {
    if (state.graph?.capture) await stopRecording();
    else await startRecording();
  } catch (error) {
    showError({ code: "recording_failed", message: `Recording failed: ${error?.message ?? error}` });
  } finally {
    ui.record.disabled = state.phase !== "connected";
  }
}

// -- start ----------------------------------------------------------------------------------

function init() {
  const query = settingsFromQuery(location.search);
  if (query.tokenUrl) {
    ui.tokenUrl.value = query.tokenUrl;
    ui.connectionDetails.open = true; // a link set it: show which URL the page would ask
  }
  if (query.instructions) ui.persona.value = query.instructions;
  for (const [box, name] of [
    [ui.echoCancellation, "echo_cancellation"],
    [ui.noiseSuppression, "noise_suppression"],
    [ui.autoGain, "auto_gain"],
  ]) {
    const value = new URLSearchParams(location.search).get(name);
    if (value === "0" || value === "false") box.checked = false;
  }
  ui.call.addEventListener("click", startCall);
  ui.hangup.addEventListener("click", hangUp);
  ui.record.addEventListener("click", toggleRecording);
  ui.recordMode.addEventListener("change", () => {
    if (state.recording && !state.graph?.capture) publishRecording();
  });
  ui.applySession.addEventListener("click", () => {
    const update = state.active ? pendingUpdate(formFields(), state.active) : null;
    if (!update) setStatus("Connected. Nothing to change.");
    else if (state.call?.send(update)) setStatus("Connected. Updating the session…");
  });
  ui.mic.addEventListener("change", reopenMicrophone);
  for (const box of [ui.echoCancellation, ui.noiseSuppression, ui.autoGain]) {
    box.addEventListener("change", reopenMicrophone);
  }
  ui.tokenUrl.addEventListener("change", onTokenUrlChange);
  ui.loadVoices.addEventListener("click", loadVoicesWithToken);
  document.getElementById("settings").addEventListener("submit", (event) => event.preventDefault());
  navigator.mediaDevices?.addEventListener?.("devicechange", () => refreshMicrophones().catch(() => {}));
  window.addEventListener("pagehide", () => state.call?.hangup());
  renderStats(null, "idle");
  setPhase("idle");
  refreshMicrophones().catch(() => {});
  showTokenOrigins();
  const refusal = tokenUrlRefusal();
  if (refusal) showError(refusal);
  loadServerInfo(); // no secret, so no request to the token URL
}

// A read-only handle for tests, benchmarks and curious developers (devtools console).
window.voiceApp = {
  get phase() { return state.phase; },
  get call() { return state.call; },
  get stats() { return state.lastStats; },
  get timings() { return { ...state.timings }; },
  get recording() { return state.recording; },
  get transcript() { return state.transcript.text; },
  get audioContextState() { return state.graph?.context.state ?? null; },
  get iceRestarts() { return state.recovery?.restarts ?? 0; },
};

init();
