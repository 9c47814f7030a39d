// The agent's spoken text, assembled from Realtime transcript events.
//
// Deltas for one response arrive in order on a reliable data channel; `.done` carries the
// server's full text for the segment and wins over what the deltas added up to, so a
// dropped or duplicated delta heals at the end of each segment. A full-duplex agent may go
// on talking under the same response id after a segment's `.done`: those deltas start a new
// entry rather than being lost.

const MAX_ENTRIES = 200;

export class Transcript {
  constructor(maxEntries = MAX_ENTRIES) {
    this.maxEntries = maxEntries;
    this.entries = [];
    this.byId = new Map();
  }

  /** Apply one server event; returns true when the visible transcript changed. */
  apply(event) {
    if (!event || typeof event.type !== "string") return false;
    switch (event.type) {
      case "response.output_audio_transcript.delta":
        return this.#appendDelta(event);
      case "response.output_audio_transcript.done":
        return this.#finish(event);
      case "output_audio_buffer.cleared":
        return this.#interrupt(event);
      default:
        return false;
    }
  }

  get text() {
    return this.entries.map((entry) => entry.text).join("\n");
  }

  clear() {
    this.entries = [];
    this.byId.clear();
  }

  #keyOf(event) {
    return event.item_id ?? event.response_id ?? "response";
  }

  #entry(key, reopen = false) {
    let entry = this.byId.get(key);
    if (!entry || (reopen && entry.done)) {
      entry = { id: key, text: "", done: false, interrupted: false };
      this.byId.set(key, entry);
      this.entries.push(entry);
      while (this.entries.length > this.maxEntries) {
        const evicted = this.entries.shift();
        if (this.byId.get(evicted.id) === evicted) this.byId.delete(evicted.id);
      }
    }
    return entry;
  }

  #appendDelta(event) {
    if (typeof event.delta !== "string" || event.delta === "") return false;
    const entry = this.#entry(this.#keyOf(event), true);
    entry.text += event.delta;
    return true;
  }

  #finish(event) {
    const key = this.#keyOf(event);
    const known = this.byId.get(key);
    if (!known && typeof event.transcript !== "string") return false;
    const entry = known ?? this.#entry(key);
    const before = entry.text;
    if (typeof event.transcript === "string") entry.text = event.transcript;
    entry.done = true;
    return entry.text !== before || !known;
  }

  #interrupt(event) {
    const entry = this.byId.get(event.response_id);
    if (!entry || entry.done) return false;
    entry.done = true;
    entry.interrupted = true;
    return true;
  }
}
