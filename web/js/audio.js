// Browser audio: the microphone, its level, pcm16 capture at 24 kHz and playback of pcm16 deltas.

export const PCM_RATE = 24000;

/** The microphone, with the browser's echo cancellation (the assistant must not hear itself). */
export async function openMicrophone() {
  if (!navigator.mediaDevices?.getUserMedia) {
    throw new Error("this browser has no microphone access here (the page needs https or localhost)");
  }
  return navigator.mediaDevices.getUserMedia({
    audio: { channelCount: 1, echoCancellation: true, noiseSuppression: true, autoGainControl: true },
  });
}

/** Level (0..1, RMS) of an AudioNode's signal, read on demand. */
export function levelMeter(ctx, node) {
  const analyser = ctx.createAnalyser();
  analyser.fftSize = 1024;
  node.connect(analyser);
  const buf = new Float32Array(analyser.fftSize);
  return () => {
    analyser.getFloatTimeDomainData(buf);
    let sum = 0;
    for (const x of buf) sum += x * x;
    return Math.sqrt(sum / buf.length);
  };
}

export function int16ToBase64(int16) {
  const bytes = new Uint8Array(int16.buffer, int16.byteOffset, int16.byteLength);
  let bin = "";
  for (let i = 0; i < bytes.length; i += 0x8000) bin += String.fromCharCode(...bytes.subarray(i, i + 0x8000));
  return btoa(bin);
}

export function base64ToFloat32(b64) {
  const bin = atob(b64);
  const out = new Float32Array(bin.length >> 1);
  for (let i = 0; i < out.length; i++) {
    let v = bin.charCodeAt(2 * i) | (bin.charCodeAt(2 * i + 1) << 8);
    if (v >= 0x8000) v -= 0x10000;
    out[i] = v / 32768;
  }
  return out;
}

/**
 * Capture `source` as pcm16 at 24 kHz in 20 ms chunks: an AudioWorklet where there is one, else a
 * ScriptProcessor. `onChunk(Int16Array)` gets each chunk. Returns a function that stops capture.
 */
export async function capturePcm16(ctx, source, onChunk) {
  if (ctx.audioWorklet) {
    await ctx.audioWorklet.addModule("/web/js/pcm-worklet.js");
    const node = new AudioWorkletNode(ctx, "pcm16-capture", { processorOptions: { targetRate: PCM_RATE } });
    node.port.onmessage = (e) => onChunk(e.data);
    source.connect(node);
    return () => { source.disconnect(node); node.port.onmessage = null; };
  }
  const node = ctx.createScriptProcessor(2048, 1, 1);
  const pack = packer(ctx.sampleRate, PCM_RATE, onChunk);
  node.onaudioprocess = (e) => pack(e.inputBuffer.getChannelData(0));
  source.connect(node);
  node.connect(ctx.destination); // a ScriptProcessor only runs when connected; it outputs silence
  return () => { source.disconnect(node); node.disconnect(); };
}

/** Linear resampling from `inRate` to `outRate`, packed into 20 ms Int16Array chunks. */
export function packer(inRate, outRate, onChunk) {
  const step = inRate / outRate;
  const size = outRate / 50;
  let pos = 0; // position of the next output sample, in input samples (relative to `prev`)
  let prev = 0;
  let out = new Int16Array(size);
  let n = 0;
  return (input) => {
    while (pos < input.length) {
      const i = Math.floor(pos);
      const a = i === 0 ? prev : input[i - 1];
      const b = input[i];
      const frac = pos - i;
      const x = a + (b - a) * frac;
      out[n++] = Math.max(-1, Math.min(1, x)) * 32767;
      if (n === size) { onChunk(out); out = new Int16Array(size); n = 0; }
      pos += step;
    }
    pos -= input.length;
    prev = input[input.length - 1];
  };
}

/** Plays pcm16 24 kHz deltas back to back; `clear()` stops at once and says how much was heard. */
export class Player {
  constructor(ctx) {
    this.ctx = ctx;
    this.out = ctx.createGain();
    this.out.connect(ctx.destination);
    this.level = levelMeter(ctx, this.out);
    this.sources = [];
    this.playhead = 0;
    this.item = null; // { id, pieces: [{at, duration}], done } of the item being played
  }

  play(itemId, pcm) {
    const ctx = this.ctx;
    const buffer = ctx.createBuffer(1, pcm.length, PCM_RATE);
    buffer.copyToChannel(pcm, 0);
    const src = ctx.createBufferSource();
    src.buffer = buffer;
    src.connect(this.out);
    const at = Math.max(this.playhead, ctx.currentTime + 0.03);
    if (!this.item || this.item.id !== itemId) this.item = { id: itemId, pieces: [], done: false };
    this.item.pieces.push({ at, duration: buffer.duration });
    src.start(at);
    this.playhead = at + buffer.duration;
    this.sources.push(src);
    src.onended = () => { this.sources = this.sources.filter((s) => s !== src); };
  }

  get playing() { return this.playhead > this.ctx.currentTime; }

  /** No more audio will come for `itemId` (response.output_audio.done). */
  finish(itemId) { if (this.item?.id === itemId) this.item.done = true; }

  /** Stop playback; returns {itemId, playedMs} of the item cut short, or null. */
  clear() {
    for (const s of this.sources) { try { s.stop(); } catch { /* already stopped */ } }
    this.sources = [];
    let cut = null;
    if (this.item && (this.playing || !this.item.done)) { // playing, or ran dry waiting for more
      // what was heard: the pieces played so far (a gap between pieces, when the audio came late, is no audio)
      const now = this.ctx.currentTime;
      const played = this.item.pieces.reduce((sum, p) => sum + Math.min(Math.max(now - p.at, 0), p.duration), 0);
      cut = { itemId: this.item.id, playedMs: Math.round(played * 1000) };
    }
    this.playhead = 0;
    this.item = null;
    return cut;
  }
}
