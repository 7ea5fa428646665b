// WebRTC transport, as OpenAI's Realtime WebRTC: the offer goes to POST /v1/realtime/calls, events
// ride the "oai-events" data channel, the server plays the assistant's audio on the remote track.

const GATHER_TIMEOUT_MS = 3000;

export class WebRTCTransport {
  constructor({ onEvent, onState, audioElement }) {
    this.onEvent = onEvent;
    this.onState = onState;
    this.playing = false; // between output_audio_buffer.started and .stopped/.cleared
    this.stopping = false; // stopped/cleared came: count one more poll (the tail in the jitter buffer)
    this.audio = audioElement;
    this.pc = null;
    this.dc = null;
    this.callUrl = null;
    this.secret = null;
    this.audioLevel = 0;
    this.receivedMs = 0;
    this.energy = 0;
    this.samplesDuration = null;
    this.statsTimer = null;
  }

  async connect(secret, mic) {
    this.secret = secret;
    const pc = new RTCPeerConnection({ iceServers: [] });
    this.pc = pc;
    pc.onconnectionstatechange = () => {
      this.onState(pc.connectionState);
    };
    pc.ontrack = (e) => {
      this.audio.srcObject = e.streams[0] || new MediaStream([e.track]);
      this.audio.play().catch(() => { /* autoplay refused: the next click plays */ });
    };
    for (const track of mic.getAudioTracks()) pc.addTrack(track, mic);
    const dc = pc.createDataChannel("oai-events");
    this.dc = dc;
    dc.onmessage = (e) => this.handle(JSON.parse(e.data));
    const opened = new Promise((resolve, reject) => {
      dc.onopen = resolve;
      dc.onerror = () => reject(new Error("the data channel failed"));
    });

    await pc.setLocalDescription(await pc.createOffer());
    await gathered(pc);
    const resp = await fetch("/v1/realtime/calls", {
      method: "POST",
      headers: { "Content-Type": "application/sdp", Authorization: `Bearer ${secret}` },
      body: pc.localDescription.sdp,
    });
    if (resp.status !== 201) throw new Error(`POST /v1/realtime/calls: ${resp.status} ${await resp.text()}`);
    this.callUrl = resp.headers.get("Location");
    await pc.setRemoteDescription({ type: "answer", sdp: await resp.text() });
    await opened;
    this.statsTimer = setInterval(() => this.pollStats(), 200);
  }

  handle(event) {
    if (event.type === "output_audio_buffer.started") { this.playing = true; this.stopping = false; }
    if (event.type === "output_audio_buffer.stopped" || event.type === "output_audio_buffer.cleared") {
      this.stopping = this.playing;
    }
    this.onEvent(event);
  }

  send(event) {
    if (this.dc?.readyState === "open") this.dc.send(JSON.stringify(event));
  }

  /** The largest event the channel carries (the server's SCTP `max-message-size`; the browser
   *  refuses to send a larger message). */
  get maxEventChars() { return this.pc?.sctp?.maxMessageSize || 65536; }

  /** The remote audio as the browser's receiver sees it: its level and energy, and how long it has
   *  played while the server said it was playing the assistant (the track carries silence otherwise). */
  async pollStats() {
    if (!this.pc) return;
    const stats = await this.pc.getStats();
    stats.forEach((s) => {
      if (s.type === "inbound-rtp" && s.kind === "audio") {
        this.audioLevel = s.audioLevel ?? 0;
        this.energy = s.totalAudioEnergy ?? 0;
        const total = s.totalSamplesDuration ?? 0;
        if (this.playing && this.samplesDuration !== null) this.receivedMs += 1000 * (total - this.samplesDuration);
        this.samplesDuration = total;
        if (this.stopping) { this.playing = false; this.stopping = false; }
        this.packets = s.packetsReceived ?? 0;
        this.bytes = s.bytesReceived ?? 0;
      }
    });
  }

  outputLevel() { return this.audioLevel; }

  async close() {
    clearInterval(this.statsTimer);
    const url = this.callUrl;
    this.callUrl = null;
    if (url) {
      // tell the server at once (it would notice the closed connection, a little later)
      fetch(`${url}/hangup`, { method: "POST", headers: { Authorization: `Bearer ${this.secret}` } })
        .catch(() => {});
    }
    this.dc?.close();
    this.pc?.close();
    this.pc = null;
    this.dc = null;
    if (this.audio) this.audio.srcObject = null;
  }
}

/** Wait until ICE gathering completes (host candidates only: fast), so the offer carries them. */
function gathered(pc) {
  if (pc.iceGatheringState === "complete") return Promise.resolve();
  return new Promise((resolve) => {
    const done = () => {
      if (pc.iceGatheringState === "complete") { pc.removeEventListener("icegatheringstatechange", done); resolve(); }
    };
    pc.addEventListener("icegatheringstatechange", done);
    setTimeout(resolve, GATHER_TIMEOUT_MS);
  });
}
