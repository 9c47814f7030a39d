// Audio level arithmetic for the input/output meters (no Web Audio here, so it is testable).

export const METER_FLOOR_DB = -60;

/** Root mean square of a block of float samples in [-1, 1]. */
export function rms(samples) {
  if (!samples || samples.length === 0) return 0;
  let sum = 0;
  for (let i = 0; i < samples.length; i += 1) sum += samples[i] * samples[i];
  return Math.sqrt(sum / samples.length);
}

/** Linear amplitude → dBFS, clamped at `floorDb` so silence is a finite number. */
export function toDbfs(linear, floorDb = -100) {
  if (!(linear > 0)) return floorDb;
  return Math.max(floorDb, 20 * Math.log10(linear));
}

/** dBFS → meter fill in [0, 1], linear in dB between `floorDb` and 0 dBFS. */
export function meterFraction(db, floorDb = METER_FLOOR_DB) {
  if (!Number.isFinite(db)) return 0;
  return Math.min(1, Math.max(0, (db - floorDb) / -floorDb));
}

/**
 * A meter's ballistics: jumps up at once, falls back by at most `fallPerSecond` of the full
 * scale, so short syllables stay readable.
 */
export class MeterBallistics {
  constructor(fallPerSecond = 1.5) {
    this.fallPerSecond = fallPerSecond;
    this.value = 0;
    this.lastTime = null;
  }

  update(fraction, nowSeconds) {
    const elapsed = this.lastTime === null ? 0 : Math.max(0, nowSeconds - this.lastTime);
    this.lastTime = nowSeconds;
    const floor = this.value - this.fallPerSecond * elapsed;
    this.value = Math.max(fraction, floor, 0);
    return this.value;
  }
}
