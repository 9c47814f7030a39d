// The live connection panel: a summary of RTCStatsReport entries, and how each is shown.
//
// `summarizeStats` takes plain stat objects (`[...report.values()]`) so it runs anywhere.

function firstOf(stats, type, predicate = () => true) {
  return stats.find((s) => s.type === type && predicate(s)) ?? null;
}

function audioInbound(stats) {
  return firstOf(stats, "inbound-rtp", (s) => (s.kind ?? s.mediaType) === "audio");
}

function selectedPair(stats) {
  const transport = firstOf(stats, "transport", (s) => s.selectedCandidatePairId);
  if (transport) {
    const pair = stats.find((s) => s.id === transport.selectedCandidatePairId);
    if (pair) return pair;
  }
  // Firefox has no transport stats; it flags its pair with a non-standard `selected`.
  return (
    firstOf(stats, "candidate-pair", (s) => s.selected === true) ??
    firstOf(stats, "candidate-pair", (s) => s.nominated && s.state === "succeeded")
  );
}

function codecName(stats, rtp) {
  if (!rtp || !rtp.codecId) return null;
  const codec = stats.find((s) => s.id === rtp.codecId);
  if (!codec || typeof codec.mimeType !== "string") return null;
  const name = codec.mimeType.split("/").pop();
  return codec.clockRate ? `${name} ${codec.clockRate / 1000} kHz` : name;
}

function seconds(value) {
  return typeof value === "number" && Number.isFinite(value) ? value : null;
}

/**
 * Mean jitter-buffer delay of the audio played out since `previous` (or since the start),
 * in ms: what the receiver holds back before playing a sample.
 */
function playoutDelayMs(inbound, previous) {
  if (!inbound) return null;
  const delay = seconds(inbound.jitterBufferDelay);
  const emitted = seconds(inbound.jitterBufferEmittedCount);
  if (delay === null || emitted === null) return null;
  const prevDelay = previous?.jitterBufferDelay ?? 0;
  const prevEmitted = previous?.jitterBufferEmittedCount ?? 0;
  const recent = emitted - prevEmitted;
  if (recent > 0 && delay >= prevDelay) return ((delay - prevDelay) / recent) * 1000;
  return emitted > 0 ? (delay / emitted) * 1000 : null;
}

/** The numbers the panel shows. `previous` is the summary from the last poll, if any. */
export function summarizeStats(stats, previous = null) {
  const list = Array.from(stats ?? []);
  const inbound = audioInbound(list);
  const outbound = firstOf(list, "outbound-rtp", (s) => (s.kind ?? s.mediaType) === "audio");
  const remoteInbound = firstOf(list, "remote-inbound-rtp");
  const pair = selectedPair(list);
  const rtt = seconds(pair?.currentRoundTripTime) ?? seconds(remoteInbound?.roundTripTime);
  const jitter = seconds(inbound?.jitter);
  return {
    codec: codecName(list, inbound) ?? codecName(list, outbound),
    rttMs: rtt === null ? null : rtt * 1000,
    jitterMs: jitter === null ? null : jitter * 1000,
    packetsLost: typeof inbound?.packetsLost === "number" ? inbound.packetsLost : null,
    packetsReceived: inbound?.packetsReceived ?? null,
    bytesReceived: inbound?.bytesReceived ?? null,
    bytesSent: outbound?.bytesSent ?? null,
    audioLevel: seconds(inbound?.audioLevel),
    playoutDelayMs: playoutDelayMs(inbound, previous?.raw),
    raw: inbound
      ? {
          jitterBufferDelay: inbound.jitterBufferDelay ?? 0,
          jitterBufferEmittedCount: inbound.jitterBufferEmittedCount ?? 0,
        }
      : null,
  };
}

const DASH = "—";

function ms(value) {
  if (value === null || value === undefined) return DASH;
  // Loopback and LAN round trips are well under 10 ms: keep a decimal so they don't read 0.
  return value < 10 ? `${value.toFixed(1)} ms` : `${Math.round(value)} ms`;
}

function lossText(summary) {
  if (summary.packetsLost === null) return DASH;
  const received = summary.packetsReceived ?? 0;
  const total = received + Math.max(0, summary.packetsLost);
  const percent = total > 0 ? (Math.max(0, summary.packetsLost) / total) * 100 : 0;
  return `${summary.packetsLost} (${percent.toFixed(1)} %)`;
}

function kilobytes(value) {
  return value === null || value === undefined ? DASH : `${(value / 1000).toFixed(1)} kB`;
}

/** Label/value rows for the panel, in display order. */
export function formatStats(summary, connectionState) {
  const s = summary ?? {};
  return [
    ["State", connectionState || DASH],
    ["Codec", s.codec ?? DASH],
    ["Round trip", ms(s.rttMs)],
    ["Jitter", ms(s.jitterMs)],
    ["Packets lost", summary ? lossText(s) : DASH],
    ["Playout delay", ms(s.playoutDelayMs)],
    ["Received", kilobytes(s.bytesReceived)],
  ];
}
