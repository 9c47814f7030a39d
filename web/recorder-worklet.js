// AudioWorklet: forwards each render quantum of input 0 (caller) and input 1 (agent) to the
// page, batched so the main thread wakes a few times per second rather than 375 times.

const BATCH_FRAMES = 4096;

class CallCaptureProcessor extends AudioWorkletProcessor {
  constructor() {
    super();
    this.caller = new Float32Array(BATCH_FRAMES);
    this.agent = new Float32Array(BATCH_FRAMES);
    this.filled = 0;
    this.port.onmessage = (event) => {
      if (event.data === "flush") this.flush(true);
    };
  }

  flush(always = false) {
    if (this.filled === 0 && !always) return;
    const caller = this.caller.slice(0, this.filled);
    const agent = this.agent.slice(0, this.filled);
    this.port.postMessage({ caller, agent }, [caller.buffer, agent.buffer]);
    this.filled = 0;
  }

  process(inputs) {
    const callerBlock = inputs[0]?.[0];
    const agentBlock = inputs[1]?.[0];
    const frames = callerBlock?.length ?? agentBlock?.length ?? 128;
    for (let i = 0; i < frames; i += 1) {
      // An input with nothing connected (or a muted track) has no channels: record silence.
      this.caller[this.filled] = callerBlock ? callerBlock[i] : 0;
      this.agent[this.filled] = agentBlock ? agentBlock[i] : 0;
      this.filled += 1;
      if (this.filled === BATCH_FRAMES) this.flush();
    }
    return true;
  }
}

registerProcessor("call-capture", CallCaptureProcessor);
