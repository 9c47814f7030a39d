// A call that survives a network change: when a connected call's audio stops arriving for a
// second, or its connection fails (or stays "disconnected"), the page restarts ICE
// (pc.restartIce() and a re-offer on the same call resource, VoiceCall.restartIce) instead
// of ending the call. The agent answers with new ICE credentials and keeps the call, its
// conversation and its event stream.

// Chromium says "disconnected" after a few seconds without answers; a path that stays so
// this long is given up for a new one.
export const RESTART_AFTER_DISCONNECTED_MS = 2000;
// The agent sends a packet every 20 ms for the whole call (silence included), so a second
// without one means the path under the call is gone: restart then, long before Chromium says
// "disconnected" (about 5-6 s after its checks stop being answered). A restart on a path
// that still works costs nothing audible (the old pair carries media until the new one is
// checked), so a false alarm is cheap; one per stall, until audio flows again.
export const RESTART_AFTER_SILENCE_MS = 1000;
// How often the inbound audio's packet count is read (getStats) while a call is up.
export const INBOUND_POLL_MS = 200;
// Restarts in a row that did not get the call back to "connected" before the page gives up.
export const MAX_RESTARTS = 3;

/**
 * Decides when to restart. `restart()` does it (a promise); `report(step, detail)` is told
 * "restarting" (detail: attempt), "recovered" (detail: restarts so far) and "restart-failed"
 * (detail: the error). `onState` returns true while a restart handles the state, so the
 * page must not end the call for it. `onInboundPackets` (fed by `watchInbound`) restarts
 * when connected audio stops arriving for `silenceMs`.
 */
export class IceRecovery {
  constructor({ restart, report = () => {}, setTimer = (fn, ms) => setTimeout(fn, ms),
                clearTimer = (id) => clearTimeout(id), delayMs = RESTART_AFTER_DISCONNECTED_MS,
                maxRestarts = MAX_RESTARTS, silenceMs = RESTART_AFTER_SILENCE_MS,
                setRepeat = (fn, ms) => setInterval(fn, ms),
                clearRepeat = (id) => clearInterval(id), now = () => performance.now() }) {
    this.restart = restart;
    this.report = report;
    this.setTimer = setTimer;
    this.clearTimer = clearTimer;
    this.delayMs = delayMs;
    this.maxRestarts = maxRestarts;
    this.silenceMs = silenceMs;
    this.setRepeat = setRepeat;
    this.clearRepeat = clearRepeat;
    this.now = now;
    this.connectionState = "new";
    this.packets = 0; // inbound audio packets counted so far
    this.lastPacketAt = null; // when that count last grew
    this.silenceHandled = false; // this stall already got its restart
    this.watcher = null;
    this.wasConnected = false;
    this.attempts = 0; // since the last "connected"
    this.restarts = 0; // over the call
    this.timer = null;
    this.inFlight = null;
    this.stopped = false;
  }

  onState(connectionState) {
    this.connectionState = connectionState;
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

  /** The inbound audio's packet counter read at `atMs`: restarts when it has not grown for
   * `silenceMs` on a connected call that had audio; a count that grows again after a
   * restart is the recovery. */
  onInboundPackets(packets, atMs) {
    if (this.stopped) return;
    if (packets > this.packets) {
      this.packets = packets;
      this.lastPacketAt = atMs;
      if (this.silenceHandled && this.attempts > 0 && !this.inFlight
          && this.connectionState === "connected") {
        this.attempts = 0;
        this.report("recovered", this.restarts);
      }
      this.silenceHandled = false;
      return;
    }
    if (this.lastPacketAt === null || this.silenceHandled || !this.wasConnected) return;
    if (atMs - this.lastPacketAt < this.silenceMs) return;
    if (this.connectionState !== "connected" && this.connectionState !== "disconnected") return;
    this.silenceHandled = true;
    this.#cancelTimer();
    this.#start();
  }

  /** Reads `pc()`'s inbound audio packet count every INBOUND_POLL_MS into
   * `onInboundPackets`, until `stop()`. */
  watchInbound(pc, intervalMs = INBOUND_POLL_MS) {
    if (this.stopped || this.watcher !== null) return;
    this.watcher = this.setRepeat(async () => {
      const connection = pc();
      if (!connection || connection.connectionState === "closed") return;
      let report;
      try {
        report = await connection.getStats();
      } catch {
        return; // closed meanwhile
      }
      for (const s of report.values()) {
        if (s.type === "inbound-rtp" && (s.kind ?? s.mediaType) === "audio") {
          this.onInboundPackets(s.packetsReceived ?? 0, this.now());
          return;
        }
      }
    }, intervalMs);
  }

  /** The call ended: no more restarts. */
  stop() {
    this.stopped = true;
    this.#cancelTimer();
    if (this.watcher !== null) this.clearRepeat(this.watcher);
    this.watcher = null;
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
