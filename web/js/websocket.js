// WebSocket transport: /v1/realtime with pcm16 at 24 kHz both ways. The page owns playout here: on a
// barge-in it stops playing and tells the server how much was heard (conversation.item.truncate).

import { PCM_RATE, Player, base64ToFloat32, capturePcm16, int16ToBase64 } from "./audio.js";

export class WebSocketTransport {
  constructor({ onEvent, onState }) {
    this.onEvent = onEvent;
    this.onState = onState;
    this.ws = null;
    this.ctx = null;
    this.player = null;
    this.stopCapture = null;
    this.receivedMs = 0;
    this.truncates = 0; // conversation.item.truncate sent at barge-ins
  }

  async connect(secret, mic, ctx) {
    this.ctx = ctx;
    this.player = new Player(ctx);
    const url = new URL("/v1/realtime?model=omnivoice", location.href);
    url.protocol = location.protocol === "https:" ? "wss:" : "ws:";
    // browsers cannot set headers on a WebSocket: the secret rides a subprotocol, as with OpenAI
    const ws = new WebSocket(url, ["realtime", `openai-insecure-api-key.${secret}`]);
    this.ws = ws;
    await new Promise((resolve, reject) => {
      ws.onopen = resolve;
      ws.onerror = () => reject(new Error("the WebSocket connection failed"));
    });
    ws.onmessage = (e) => this.handle(JSON.parse(e.data));
    ws.onclose = (e) => this.onState(e.code === 1000 ? "closed" : `closed (${e.code})`);
    this.onState("connected");
    const source = ctx.createMediaStreamSource(mic);
    this.stopCapture = await capturePcm16(ctx, source, (chunk) => {
      if (ws.readyState === WebSocket.OPEN) {
        ws.send(JSON.stringify({ type: "input_audio_buffer.append", audio: int16ToBase64(chunk) }));
      }
    });
  }

  handle(event) {
    if (event.type === "response.output_audio.delta") {
      const pcm = base64ToFloat32(event.delta);
      this.receivedMs += (1000 * pcm.length) / PCM_RATE;
      this.player.play(event.item_id, pcm);
    } else if (event.type === "response.output_audio.done") {
      this.player.finish(event.item_id);
    } else if (event.type === "input_audio_buffer.speech_started") {
      const cut = this.player.clear(); // barge-in: stop at once, keep only what was heard
      if (cut) {
        this.truncates += 1;
        this.send({ type: "conversation.item.truncate", item_id: cut.itemId, content_index: 0, audio_end_ms: cut.playedMs });
      }
    }
    this.onEvent(event);
  }

  send(event) {
    if (this.ws?.readyState === WebSocket.OPEN) this.ws.send(JSON.stringify(event));
  }

  /** No limit of its own: the server answers an event over `realtime.max_event_bytes` with an error. */
  get maxEventChars() { return Infinity; }

  outputLevel() { return this.player ? this.player.level() : 0; }

  async close() {
    this.stopCapture?.();
    this.player?.clear();
    if (this.ws) {
      this.ws.onclose = null;
      this.ws.close(1000);
    }
    this.ws = null;
  }
}
