// A call that survives a network change: when a connected call's connection fails (or
// stays "disconnected"), the page restarts ICE (pc.restartIce() and a re-offer on the same
// call resource, VoiceCall.restartIce) instead of ending the call. The agent answers with
// new ICE credentials and keeps the call, its conversation and its event stream.

// Chromium says "disconnected" after a few seconds without answers; a path that stays so
// this long is given up for a new one.
export const RESTART_AFTER_DISCONNECTED_MS = 2000;
// Restarts in a row that did not get the call back to "connected" before the page gives up.
export const MAX_RESTARTS = 3;

/**
 * Decides when to restart. `restart()` does it (a promise); `report(step, detail)` is told
 * "restarting" (detail: attempt), "recovered" (detail: restarts so far) and "restart-failed"
 * (detail: the error). `onState` returns true while a restart handles the state, so the
 * page must not end the call for it.
 */
export class IceRecovery {
  constructor({ restart, report = () => {}, setTimer = (fn, ms) => setTimeout(fn, ms),
                clearTimer = (id) => clearTimeout(id), delayMs = RESTART_AFTER_DISCONNECTED_MS,
                maxRestarts = MAX_RESTARTS }) {
    this.restart = restart;
    this.report = report;
    this.setTimer = setTimer;
    this.clearTimer = clearTimer;
    this.delayMs = delayMs;
    this.maxRestarts = maxRestarts;
    this.wasConnected = false;
    this.attempts = 0; // since the last "connected"
    this.restarts = 0; // over the call
    this.timer = null;
    this.inFlight = null;
    this.stopped = false;
  }

  onState(connectionState) {
    if (this.stopped) return false;
    if (connectionState === "connected") {
      this.#cancelTimer();
      if (this.attempts > 0) this.report("recovered", this.restarts);
      this.attempts = 0;
      this.wasConnected = true;
      return false;
    }
    if (!this.wasConnected) return false; // never connected: a setup failure, not a change
    if (connectionState === "disconnected") {
      this.#cancelTimer();
      this.timer = this.setTimer(() => {
        this.timer = null;
        this.#start();
      }, this.delayMs);
      return true;
    }
    if (connectionState === "failed") {
      this.#cancelTimer();
      if (this.inFlight) return true;
      if (this.attempts >= this.maxRestarts) return false;
      this.#start();
      return true;
    }
    if (connectionState === "closed") this.stop();
    return connectionState === "connecting" || connectionState === "new";
  }

  /** The call ended: no more restarts. */
  stop() {
    this.stopped = true;
    this.#cancelTimer();
  }

  #cancelTimer() {
    if (this.timer !== null) this.clearTimer(this.timer);
    this.timer = null;
  }

  #start() {
    if (this.inFlight || this.stopped || this.attempts >= this.maxRestarts) return;
    this.attempts += 1;
    this.restarts += 1;
    this.report("restarting", this.attempts);
    this.inFlight = Promise.resolve()
      .then(() => this.restart())
      .catch((error) => this.report("restart-failed", error))
      .finally(() => {
        this.inFlight = null;
      });
  }
}
