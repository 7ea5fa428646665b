// AudioWorklet: the microphone as pcm16 at `targetRate` in 20 ms Int16Array chunks (linear resampling).

class Pcm16Capture extends AudioWorkletProcessor {
  constructor(options) {
    super();
    const target = options.processorOptions.targetRate;
    this.step = sampleRate / target; // `sampleRate` is the context's, a global in worklet scope
    this.size = target / 50;
    this.pos = 0;
    this.prev = 0;
    this.out = new Int16Array(this.size);
    this.n = 0;
  }

  process(inputs) {
    const input = inputs[0] && inputs[0][0];
    if (!input) return true;
    while (this.pos < input.length) {
      const i = Math.floor(this.pos);
      const a = i === 0 ? this.prev : input[i - 1];
      const x = a + (input[i] - a) * (this.pos - i);
      this.out[this.n++] = Math.max(-1, Math.min(1, x)) * 32767;
      if (this.n === this.size) {
        this.port.postMessage(this.out, [this.out.buffer]);
        this.out = new Int16Array(this.size);
        this.n = 0;
      }
      this.pos += this.step;
    }
    this.pos -= input.length;
    this.prev = input[input.length - 1];
    return true;
  }
}

registerProcessor("pcm16-capture", Pcm16Capture);
