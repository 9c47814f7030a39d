// The call's session settings: what the page asks for, and what stays editable mid-call.

/** Form values → an OpenAI-Realtime-shaped session object (null when nothing is set). */
export function sessionFromForm({ voice, instructions }) {
  const session = { type: "realtime" };
  let any = false;
  if (typeof instructions === "string" && instructions.trim()) {
    session.instructions = instructions;
    any = true;
  }
  if (typeof voice === "string" && voice) {
    session.audio = { output: { voice } };
    any = true;
  }
  return any ? session : null;
}

/** The client event that changes voice/instructions during a call. */
export function sessionUpdateEvent(fields) {
  return { type: "session.update", session: sessionFromForm(fields) ?? { type: "realtime" } };
}

/**
 * Which fields the page must lock while a call runs. Before `session.created` arrives
 * nothing is known, so both stay locked; afterwards the plugin's capabilities decide.
 */
export function lockedFields(capabilities) {
  if (!capabilities || typeof capabilities !== "object") {
    return { voice: true, instructions: true };
  }
  return {
    voice: capabilities.voice_update !== true,
    instructions: capabilities.instructions_update !== true,
  };
}

/** What a `session.created` / `session.updated` says the call is really using. */
export function activeSession(event) {
  const session = event?.session ?? {};
  const voice = session.voice ?? session.audio?.output?.voice ?? null;
  return {
    id: typeof session.id === "string" ? session.id : null,
    voice: typeof voice === "string" ? voice : null,
    instructions: typeof session.instructions === "string" ? session.instructions : null,
    capabilities: session.capabilities && typeof session.capabilities === "object"
      ? session.capabilities
      : null,
  };
}

/**
 * Fields the form asks for that the session does not have yet, as a `session.update`, or
 * null when the session already matches (or cannot change them).
 */
export function pendingUpdate(form, active) {
  const locked = lockedFields(active.capabilities);
  const wanted = {};
  if (!locked.voice && form.voice && form.voice !== active.voice) wanted.voice = form.voice;
  if (
    !locked.instructions &&
    typeof form.instructions === "string" &&
    form.instructions.trim() &&
    form.instructions !== active.instructions
  ) {
    wanted.instructions = form.instructions;
  }
  return Object.keys(wanted).length ? sessionUpdateEvent(wanted) : null;
}
