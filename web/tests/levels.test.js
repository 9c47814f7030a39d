import { test } from "node:test";
import assert from "node:assert/strict";
import { MeterBallistics, meterFraction, rms, toDbfs } from "../levels.js";

test("rms of silence, a constant and a full-scale square", () => {
  assert.equal(rms(new Float32Array(8)), 0);
  assert.equal(rms([]), 0);
  assert.ok(Math.abs(rms(Float32Array.from([0.5, -0.5, 0.5, -0.5])) - 0.5) < 1e-9);
  assert.equal(rms(Float32Array.from([1, -1])), 1);
});

test("dBFS conversion with a floor", () => {
  assert.equal(toDbfs(1), 0);
  assert.ok(Math.abs(toDbfs(0.1) + 20) < 1e-9);
  assert.equal(toDbfs(0), -100);
  assert.equal(toDbfs(-1), -100);
  assert.equal(toDbfs(1e-9, -60), -60);
});

test("meter fraction is linear in dB between the floor and 0 dBFS", () => {
  assert.equal(meterFraction(0), 1);
  assert.equal(meterFraction(-60), 0);
  assert.equal(meterFraction(-30), 0.5);
  assert.equal(meterFraction(-90), 0);
  assert.equal(meterFraction(6), 1);
  assert.equal(meterFraction(Number.NaN), 0);
});

test("ballistics rise at once and fall at a bounded rate", () => {
  const m = new MeterBallistics(1.0);
  assert.equal(m.update(0.8, 0), 0.8);
  assert.ok(Math.abs(m.update(0, 0.1) - 0.7) < 1e-9);
  assert.equal(m.update(0.9, 0.2), 0.9);
  assert.equal(m.update(0, 5), 0);
});
