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

test("connected audio that stops for a second restarts once, and its return is the recovery",
  async () => {
    const h = harness();
    h.recovery.onState("connected");
    h.recovery.onInboundPackets(50, 1000);
    h.recovery.onInboundPackets(50, 1900); // 900 ms without a packet: not yet
    await settle();
    assert.equal(h.restarts(), 0);
    h.recovery.onInboundPackets(50, 2000);
    await settle();
    assert.equal(h.restarts(), 1);
    assert.deepEqual(h.steps, [["restarting", 1]]);
    h.recovery.onInboundPackets(50, 3500); // the same stall: no second restart
    await settle();
    assert.equal(h.restarts(), 1);
    h.recovery.onInboundPackets(60, 3600); // audio again, still "connected": recovered
    assert.deepEqual(h.steps, [["restarting", 1], ["recovered", 1]]);
    assert.equal(h.recovery.attempts, 0);
    h.recovery.onInboundPackets(60, 4700); // a new stall gets its own restart
    await settle();
    assert.equal(h.restarts(), 2);
  });

test("no silence restart before audio arrived, before connecting, or once stopped", async () => {
  const h = harness();
  h.recovery.onInboundPackets(0, 0);
  h.recovery.onInboundPackets(0, 5000); // no audio yet
  h.recovery.onState("connected");
  h.recovery.onInboundPackets(0, 9000);
  await settle();
  assert.equal(h.restarts(), 0);
  h.recovery.onInboundPackets(10, 9100);
  h.recovery.stop();
  h.recovery.onInboundPackets(10, 20000);
  await settle();
  assert.equal(h.restarts(), 0);
});

test("a silence restart while disconnected replaces the disconnected timer", async () => {
  const h = harness();
  h.recovery.onState("connected");
  h.recovery.onInboundPackets(10, 0);
  h.recovery.onState("disconnected");
  assert.equal(h.timers.length, 1);
  h.recovery.onInboundPackets(10, 1000);
  await settle();
  assert.equal(h.restarts(), 1);
  assert.equal(h.timers[0].cleared, true);
  h.recovery.onState("connected"); // recovered through the state: reported once
  h.recovery.onInboundPackets(20, 1200);
  assert.deepEqual(h.steps, [["restarting", 1], ["recovered", 1]]);
});

test("watchInbound feeds the audio packet count from getStats and stops with the call",
  async () => {
    const repeats = [];
    let clock = 0;
    let packets = 5;
    let restarts = 0;
    const pc = {
      connectionState: "connected",
      getStats: async () => new Map([
        ["o", { type: "outbound-rtp", kind: "audio", packetsSent: 99 }],
        ["i", { type: "inbound-rtp", kind: "audio", packetsReceived: packets }],
      ]),
    };
    const recovery = new IceRecovery({
      restart: async () => { restarts += 1; },
      setRepeat: (fn, ms) => { repeats.push({ fn, ms }); return repeats.length; },
      clearRepeat: (id) => { repeats[id - 1].cleared = true; },
      now: () => clock,
    });
    recovery.onState("connected");
    recovery.watchInbound(() => pc);
    recovery.watchInbound(() => pc); // one watcher only
    assert.equal(repeats.length, 1);
    await repeats[0].fn();
    assert.equal(recovery.packets, 5);
    clock = 1500;
    await repeats[0].fn();
    await settle();
    assert.equal(restarts, 1);
    recovery.stop();
    assert.equal(repeats[0].cleared, true);
  });
