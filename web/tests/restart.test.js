import { test } from "node:test";
import assert from "node:assert/strict";
import { IceRecovery } from "../restart.js";

function harness(options = {}) {
  const steps = [];
  const timers = [];
  let restarts = 0;
  const recovery = new IceRecovery({
    restart: options.restart ?? (async () => { restarts += 1; }),
    report: (step, detail) => steps.push([step, detail]),
    setTimer: (fn, ms) => { timers.push({ fn, ms }); return timers.length; },
    clearTimer: (id) => { timers[id - 1].cleared = true; },
    maxRestarts: 2,
  });
  return { recovery, steps, timers, restarts: () => restarts };
}

const settle = () => new Promise((resolve) => setTimeout(resolve, 0));

test("a failure before the first connection is left to the page", () => {
  const { recovery, steps } = harness();
  assert.equal(recovery.onState("failed"), false);
  assert.deepEqual(steps, []);
});

test("a connected call that fails restarts at once, and reports the recovery", async () => {
  const h = harness();
  h.recovery.onState("connected");
  assert.equal(h.recovery.onState("failed"), true);
  await settle();
  assert.equal(h.restarts(), 1);
  assert.deepEqual(h.steps, [["restarting", 1]]);
  h.recovery.onState("connected");
  assert.deepEqual(h.steps, [["restarting", 1], ["recovered", 1]]);
});

test("disconnected restarts only after the delay, and not if it recovers first", async () => {
  const h = harness();
  h.recovery.onState("connected");
  assert.equal(h.recovery.onState("disconnected"), true);
  assert.equal(h.timers.length, 1);
  h.recovery.onState("connected");
  assert.equal(h.timers[0].cleared, true);
  h.recovery.onState("disconnected");
  h.timers[1].fn();
  await settle();
  assert.equal(h.restarts(), 1);
});

test("gives up after the restarts allowed in a row", async () => {
  const h = harness({ restart: async () => { throw new Error("409"); } });
  h.recovery.onState("connected");
  assert.equal(h.recovery.onState("failed"), true);
  await settle();
  assert.equal(h.recovery.onState("failed"), true);
  await settle();
  assert.equal(h.recovery.onState("failed"), false);
  assert.deepEqual(h.steps.map(([step]) => step),
    ["restarting", "restart-failed", "restarting", "restart-failed"]);
});

test("after closed or stop nothing restarts", () => {
  const h = harness();
  h.recovery.onState("connected");
  h.recovery.onState("closed");
  assert.equal(h.recovery.onState("failed"), false);
});
