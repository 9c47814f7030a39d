// Every way a call can fail, as a message a person can act on.
//
// Each function returns { code, message }: `code` is stable (tests and logs match on it),
// `message` is for people.

function serverDetail(body) {
  const error = body && typeof body === "object" ? body.error : null;
  if (error && typeof error === "object") {
    return {
      code: typeof error.code === "string" ? error.code : null,
      message: typeof error.message === "string" ? error.message : null,
    };
  }
  return { code: null, message: null };
}

function retryHint(retryAfter) {
  const seconds = Number.parseInt(retryAfter ?? "", 10);
  return Number.isFinite(seconds) && seconds > 0 ? ` Try again in ${seconds} s.` : " Try again later.";
}

/** A refused `POST /v1/realtime/calls` (or token request). */
export function httpFailure(status, body, retryAfter = null) {
  const detail = serverDetail(body);
  if (status === 401 || status === 403) {
    return {
      code: "auth_required",
      message:
        "The agent needs authorization. Set a token URL (the field below, or ?token_url= in " +
        "the address) that returns an ephemeral secret." +
        (detail.message ? ` Server said: ${detail.message}` : ""),
    };
  }
  if (status === 503) {
    return {
      code: "server_full",
      message:
        "The agent is busy: every call slot is in use." +
        retryHint(retryAfter) +
        (detail.message ? ` (${detail.message})` : ""),
    };
  }
  if (status === 404) {
    return {
      code: detail.code ?? "not_found",
      message: "This server does not offer Realtime calls at /v1/realtime/calls.",
    };
  }
  if (status >= 400 && status < 500) {
    return {
      code: detail.code ?? "call_refused",
      message: `The agent refused the call: ${detail.message ?? `HTTP ${status}`}`,
    };
  }
  return {
    code: detail.code ?? "server_error",
    message: `The agent failed to start the call (HTTP ${status}).` +
      (detail.message ? ` ${detail.message}` : ""),
  };
}

/** A refused token-URL request: the app server, not the agent, said no. */
export function tokenFailure(status, body) {
  const detail = serverDetail(body);
  if (status === 0) {
    return {
      code: "token_unreachable",
      message: "The token URL could not be reached (network error or blocked by CORS).",
    };
  }
  if (status === 200) {
    return {
      code: "token_invalid",
      message: "The token URL answered without an ephemeral secret (expected {\"value\": ...}).",
    };
  }
  return {
    code: "token_refused",
    message: `The token URL refused to issue a secret (HTTP ${status})` +
      (detail.message ? `: ${detail.message}` : "."),
  };
}

const SHOWN_URL_CHARS = 80;

/**
 * The token URL was not used (config.js `tokenUrlProblem` gave `reason`): no request went to
 * it. The address text is the visitor's link, so it is shortened, and shown as text only.
 */
export function tokenUrlRefused(url, reason) {
  const text = String(url ?? "");
  const shown = text.length > SHOWN_URL_CHARS ? `${text.slice(0, SHOWN_URL_CHARS)}…` : text;
  return {
    code: "token_url_refused",
    message:
      `The token URL "${shown}" was not used: ${reason}. The page takes only this agent's own ` +
      "/v1/realtime/client_secrets, or a URL on an origin the agent's operator allowed with " +
      "--token-url-origin ORIGIN (https, or http on 127.0.0.1/localhost/[::1]).",
  };
}

/** getUserMedia failed. */
export function mediaFailure(error) {
  const name = error && typeof error === "object" ? error.name : "";
  switch (name) {
    case "NotAllowedError":
    case "SecurityError":
      return {
        code: "mic_permission_denied",
        message:
          "Microphone permission was denied. Allow microphone access for this page (the icon " +
          "in the address bar) and press Call again.",
      };
    case "NotFoundError":
    case "OverconstrainedError":
      return {
        code: "mic_not_found",
        message: "No microphone was found. Connect one, or choose another in the list.",
      };
    case "NotReadableError":
    case "AbortError":
      return {
        code: "mic_busy",
        message: "The microphone could not be opened; another application may be using it.",
      };
    default:
      return {
        code: "mic_unavailable",
        message: "The microphone is unavailable" +
          (name === "TypeError" ? " (this page needs https or localhost)." : ".") +
          (error?.message ? ` ${error.message}` : ""),
      };
  }
}

/** The peer connection reached a terminal state we did not ask for. */
export function connectionFailure(state) {
  if (state === "failed") {
    return {
      code: "ice_failed",
      message:
        "The audio connection failed (ICE): the browser and the agent could not reach each " +
        "other. A firewall may block UDP; the agent may need a TURN server.",
    };
  }
  if (state === "timeout") {
    return {
      code: "connect_timeout",
      message:
        "The audio connection did not come up in time: the browser and the agent could not " +
        "reach each other. A firewall may block UDP; the agent may need a TURN server.",
    };
  }
  return {
    code: "connection_lost",
    message: "The audio connection was lost.",
  };
}

const END_REASONS = {
  max_call_seconds: "the call reached its time limit",
  idle_timeout: "the agent stopped hearing audio from this page",
  shutdown: "the agent is shutting down",
  hangup: "the call was ended on the server",
};

/** The server ended the call: `reason` from a `call.ending` event, if one came. */
export function serverEnded(reason = null, message = null) {
  const why = message || END_REASONS[reason] || null;
  return {
    code: "ended_by_server",
    message: "The agent ended the call" + (why ? `: ${why}.` : "."),
  };
}

/** An `error` event on the data channel: shown, but the call goes on. */
export function sessionError(event) {
  const error = event && typeof event.error === "object" && event.error ? event.error : {};
  return {
    code: typeof error.code === "string" ? error.code : "session_error",
    message: `The agent reported an error: ${error.message ?? "unknown error"}`,
  };
}
