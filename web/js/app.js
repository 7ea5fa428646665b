// The voice-chat page: start/stop, the transcript, levels, and the latency of each turn (end of the
// user's speech, `input_audio_buffer.speech_stopped`, to the first audio back). `window.omnivoice`
// exposes the page's state to tests and the console.
//
// The session asks for transcripts of the caller (`audio.input.transcription`): the server's model
// writes down each spoken turn, and the user's bubble shows those words once they arrive (until then,
// "(spoken, 4.0 s)").
//
// A server with API keys needs one to mint the page's client secret: the key field appears when the
// server answers 401 (or a key is stored) and keeps the key in this browser's localStorage. The key
// only mints short-lived client secrets (ek_...); the sessions themselves use the secret.
//
// "turn ends" picks the session's turn detection: server VAD (a silence window) or semantic VAD (an
// end-of-turn model decides at each pause; eagerness low / auto / high), also set by `?turn=` (e.g.
// `?turn=semantic_vad:high`). The server's choice, as `session.updated` says, is `turnDetection`.
//
// "Share camera frame" (while connected) sends one camera frame as a user message with an
// `input_image` part (conversation.item.create) and shows its thumbnail in the transcript; the camera
// opens at the first frame, stays open for the next ones and closes with the call.

import { levelMeter, openMicrophone } from "./audio.js";
import { Camera, CameraError } from "./camera.js";
import { WebRTCTransport } from "./webrtc.js";
import { WebSocketTransport } from "./websocket.js";

const $ = (id) => document.getElementById(id);
const params = new URLSearchParams(location.search);
const KEY_STORAGE = "omnivoice.apiKey";
const TRANSCRIPTION = { model: "omnivoice" }; // the served model writes down what the caller says

const page = {
  state: "idle",
  mode: params.get("mode") === "websocket" ? "websocket" : "webrtc",
  sessionId: null,
  latencies: [],   // ms, one per answered turn
  turns: 0,        // user turns detected by the server
  audioReceivedMs: 0,
  transcript: [],  // [{role, text, status, itemId?}]
  events: [],      // types of every server event, in order
  frames: [],      // camera frames sent: [{width, height, chars, eventId, itemId?, status}]
  errors: [],
  turnDetection: null, // the session's turn_detection, as the server last confirmed it
};
window.omnivoice = page;

let transport = null;
let mic = null;
let ctx = null;
let micLevel = null;
let stopAt = null;   // performance.now() of the last speech_stopped still waiting for audio
let userBubble = null;
const userTurns = new Map(); // item id -> {li, entry (in page.transcript), text (the transcript so far)}
let replies = new Map(); // response id -> {li, text, turn latency}
let meterTimer = null;
let camera = null;   // opened at the first frame of a call, closed at its end
const framesSent = new Map(); // event id -> {li, frame} of a frame the server has not yet added
const EVENT_OVERHEAD = 256; // characters of a conversation.item.create around the frame's data URL

function setState(state) {
  page.state = state;
  const badge = $("state");
  badge.textContent = state;
  badge.dataset.state = state.startsWith("closed") || state === "failed" ? "error" : state;
}

function log(text, isError = false) {
  const li = document.createElement("li");
  li.textContent = `${new Date().toLocaleTimeString()} ${text}`;
  if (isError) li.className = "error";
  const list = $("log");
  list.append(li);
  while (list.children.length > 300) list.firstChild.remove();
  list.scrollTop = list.scrollHeight;
}

function bubble(role, text, meta = "") {
  const li = document.createElement("li");
  li.className = role;
  li.innerHTML = '<span class="who"></span><span class="text"></span><span class="meta"></span>';
  li.querySelector(".who").textContent = role === "user" ? "you" : "assistant";
  li.querySelector(".text").textContent = text;
  li.querySelector(".meta").textContent = meta;
  $("transcript").append(li);
  li.scrollIntoView({ block: "nearest" });
  return li;
}

/** The caller's words for a spoken turn, in place of "(spoken, 4.0 s)". */
function showTranscript(itemId, text) {
  const turn = userTurns.get(itemId);
  if (!turn) return;
  turn.text = text;
  if (!text.trim()) return; // nothing written yet: keep the duration
  turn.li.querySelector(".text").textContent = text;
  turn.li.classList.add("transcribed");
  turn.entry.text = text;
}

function firstAudio(responseId) {
  if (stopAt === null) return;
  const ms = Math.round(performance.now() - stopAt);
  stopAt = null;
  page.latencies.push(ms);
  const mean = page.latencies.reduce((a, b) => a + b, 0) / page.latencies.length;
  $("latency-last").textContent = `${ms} ms`;
  $("latency-mean").textContent = `${Math.round(mean)} ms`;
  const reply = replies.get(responseId);
  if (reply) {
    reply.latency = ms;
    reply.li.querySelector(".meta").textContent = `first audio after ${ms} ms`;
  }
  log(`turn latency ${ms} ms`);
}

function onEvent(ev) {
  page.events.push(ev.type);
  if (!ev.type.endsWith(".delta")) log(ev.type);
  switch (ev.type) {
    case "session.created":
      page.sessionId = ev.session.id;
      $("session-id").textContent = ev.session.id;
      break;
    case "session.updated":
      page.turnDetection = ev.session.audio?.input?.turn_detection ?? null;
      break;
    case "input_audio_buffer.speech_started":
      setState("listening");
      userBubble = bubble("user", "(speaking…)", "");
      userBubble.dataset.startMs = ev.audio_start_ms;
      break;
    case "input_audio_buffer.speech_stopped": {
      stopAt = performance.now();
      page.turns += 1;
      $("turns").textContent = String(page.turns);
      const entry = { role: "user", text: "(audio)", status: "completed", itemId: ev.item_id };
      page.transcript.push(entry);
      if (userBubble) {
        const seconds = (ev.audio_end_ms - Number(userBubble.dataset.startMs)) / 1000;
        userBubble.querySelector(".text").textContent = `(spoken, ${seconds.toFixed(1)} s)`;
        userBubble.querySelector(".meta").textContent = `turn ${page.turns}`;
        userTurns.set(ev.item_id, { li: userBubble, entry, text: "" });
      }
      setState("connected");
      break;
    }
    case "conversation.item.input_audio_transcription.delta":
      showTranscript(ev.item_id, (userTurns.get(ev.item_id)?.text ?? "") + ev.delta);
      break;
    case "conversation.item.input_audio_transcription.completed":
      showTranscript(ev.item_id, ev.transcript);
      break;
    case "conversation.item.input_audio_transcription.failed":
      log(`no transcript of ${ev.item_id}: ${ev.error?.message ?? "failed"}`, true);
      break;
    case "response.created": {
      const li = bubble("assistant", "", "thinking…");
      replies.set(ev.response.id, { li, text: "", latency: null });
      break;
    }
    case "response.output_audio_transcript.delta":
    case "response.output_text.delta": {
      const reply = replies.get(ev.response_id);
      if (reply) {
        reply.text += ev.delta;
        reply.li.querySelector(".text").textContent = reply.text;
      }
      break;
    }
    case "response.output_audio.delta": // WebSocket: the audio itself
      firstAudio(ev.response_id);
      setState("speaking");
      break;
    case "output_audio_buffer.started": // WebRTC: the server started playing on the track
      firstAudio(ev.response_id);
      setState("speaking");
      break;
    case "output_audio_buffer.stopped":
    case "output_audio_buffer.cleared":
      setState("connected");
      break;
    case "response.done": {
      const r = ev.response;
      const reply = replies.get(r.id);
      if (reply) {
        const status = r.status_details?.reason === "turn_detected" ? "interrupted" : r.status;
        if (r.status === "cancelled") reply.li.classList.add("cancelled");
        const latency = reply.latency === null ? "" : `first audio after ${reply.latency} ms · `;
        reply.li.querySelector(".meta").textContent = `${latency}${status}`;
        page.transcript.push({ role: "assistant", text: reply.text, status: r.status });
      }
      if (page.state === "speaking" && page.mode === "websocket") setState("connected");
      break;
    }
    case "conversation.item.added":
      if (ev.item.content?.some((c) => c.type === "input_image")) frameAdded(ev.item.id);
      break;
    case "error":
      page.errors.push(ev.error);
      log(`error: ${ev.error.message}`, true);
      if (framesSent.has(ev.error.event_id)) frameRefused(ev.error.event_id, ev.error.message);
      break;
    default:
  }
}

function apiKey() {
  return $("api-key").value.trim();
}

/** Show the key field (the server needs a key) and say why, beside it. */
function askForKey(message) {
  $("key-row").hidden = false;
  $("key-error").textContent = message;
  $("api-key").focus();
  throw new Error(message);
}

async function clientSecret() {
  let session = { type: "realtime" };
  if (params.get("session")) session = { ...session, ...JSON.parse(params.get("session")) };
  const headers = { "Content-Type": "application/json" };
  if (apiKey()) headers.Authorization = `Bearer ${apiKey()}`;
  const resp = await fetch("/v1/realtime/client_secrets", {
    method: "POST",
    headers,
    body: JSON.stringify({ expires_after: { anchor: "created_at", seconds: 600 }, session }),
  });
  if (resp.status === 401) {
    askForKey(apiKey() ? "the server refused this API key" : "this server needs an API key: enter it above");
  }
  if (!resp.ok) throw new Error(`client secret: ${resp.status} ${await resp.text()}`);
  $("key-error").textContent = "";
  return (await resp.json()).value;
}

async function start() {
  setState("connecting");
  $("talk").disabled = true;
  page.mode = document.querySelector('input[name="mode"]:checked').value;
  try {
    const secret = await clientSecret();
    mic = await openMicrophone();
    ctx = new AudioContext();
    await ctx.resume();
    micLevel = levelMeter(ctx, ctx.createMediaStreamSource(mic));
    const handlers = { onEvent, onState: transportState };
    transport = page.mode === "webrtc"
      ? new WebRTCTransport({ ...handlers, audioElement: $("remote-audio") })
      : new WebSocketTransport(handlers);
    await transport.connect(secret, mic, ctx);
    const input = { transcription: TRANSCRIPTION };
    const turn = turnDetection();
    if (turn) input.turn_detection = turn;
    transport.send({ type: "session.update", session: { type: "realtime", audio: { input } } });
    setState("connected");
    running(true);
  } catch (err) {
    log(String(err.message || err), true);
    page.errors.push({ message: String(err.message || err) });
    await stop();
    setState("failed");
  } finally {
    $("talk").disabled = false;
  }
}

/** The turn detection picked ("turn ends"): semantic VAD with its eagerness, or null for the
 *  server's default (server VAD). */
function turnDetection() {
  const [type, eagerness] = $("turn").value.split(":");
  return type === "semantic_vad" ? { type, eagerness } : null;
}

/** The transport's own state: a lost connection ends the session (and says why). */
function transportState(s) {
  if (s === "failed" || s.startsWith("closed")) {
    if (transport) stop().then(() => setState(s));
  } else if (s !== "connected" || page.state === "connecting") {
    setState(s);
  }
}

/** One camera frame into the conversation: a user item with an `input_image` part, and its
 *  thumbnail. A camera refused or missing is said under the button. */
async function shareFrame() {
  const button = $("camera");
  button.disabled = true;
  $("camera-error").textContent = "";
  const cam = (camera ??= new Camera());
  try {
    const shot = await cam.frame(transport.maxEventChars - EVENT_OVERHEAD);
    if (cam !== camera || !transport) { cam.close(); return; } // the call ended meanwhile
    const eventId = `evt_frame_${page.frames.length + 1}`;
    const content = [{ type: "input_image", image_url: shot.url }];
    transport.send({ type: "conversation.item.create", event_id: eventId, item: { type: "message", role: "user", content } });
    const frame = { width: shot.width, height: shot.height, chars: shot.url.length, eventId, status: "sent" };
    page.frames.push(frame);
    const li = bubble("user", "", `camera frame, ${shot.width}×${shot.height}`);
    li.classList.add("frame");
    const img = document.createElement("img");
    img.src = shot.url;
    img.alt = "camera frame";
    li.querySelector(".text").append(img);
    framesSent.set(eventId, { li, frame });
    log(`camera frame sent: ${shot.width}×${shot.height} JPEG, ${Math.round(shot.url.length / 1024)} kB`);
  } catch (err) {
    const message = err instanceof CameraError ? err.message : `the camera frame was not sent: ${err.message || err}`;
    $("camera-error").textContent = message;
    log(message, true);
  } finally {
    button.disabled = !transport;
  }
}

/** The server added the oldest frame still waiting (it takes client events in order). */
function frameAdded(itemId) {
  const [eventId, sent] = framesSent.entries().next().value ?? [];
  if (!sent) return;
  framesSent.delete(eventId);
  Object.assign(sent.frame, { itemId, status: "added" });
  sent.li.dataset.itemId = itemId;
}

function frameRefused(eventId, message) {
  const sent = framesSent.get(eventId);
  framesSent.delete(eventId);
  sent.frame.status = "refused";
  sent.li.classList.add("cancelled");
  sent.li.querySelector(".meta").textContent = `not added: ${message}`;
  $("camera-error").textContent = `the server refused the frame: ${message}`;
}

async function stop() {
  running(false);
  camera?.close();
  camera = null;
  framesSent.clear();
  await transport?.close();
  transport = null;
  mic?.getTracks().forEach((t) => t.stop());
  mic = null;
  await ctx?.close();
  ctx = null;
  micLevel = null;
  stopAt = null;
  setState("idle");
}

function running(on) {
  const talk = $("talk");
  talk.setAttribute("aria-pressed", String(on));
  $("talk-label").textContent = on ? "Stop" : "Start talking";
  document.querySelectorAll('input[name="mode"]').forEach((el) => { el.disabled = on; });
  $("turn").disabled = on;
  $("camera").disabled = !on;
  clearInterval(meterTimer);
  meterTimer = on ? setInterval(meters, 100) : null;
  if (!on) { $("in-level").style.width = "0%"; $("out-level").style.width = "0%"; }
}

function meters() {
  const scale = (x) => `${Math.min(100, Math.round(Math.sqrt(x) * 200))}%`;
  if (micLevel) $("in-level").style.width = scale(micLevel());
  if (transport) {
    $("out-level").style.width = scale(transport.outputLevel());
    page.audioReceivedMs = transport.receivedMs;
    page.audioEnergy = transport.energy ?? null;
    page.truncates = transport.truncates ?? 0;
    $("audio-received").textContent = `${(transport.receivedMs / 1000).toFixed(1)} s`;
  }
}

document.querySelector(`input[name="mode"][value="${page.mode}"]`).checked = true;
const turnParam = params.get("turn");
if (turnParam) {
  const value = turnParam === "semantic_vad" ? "semantic_vad:auto" : turnParam;
  if ([...$("turn").options].some((o) => o.value === value)) $("turn").value = value;
}
const storedKey = localStorage.getItem(KEY_STORAGE);
if (storedKey) {
  $("api-key").value = storedKey;
  $("key-row").hidden = false;
}
$("api-key").addEventListener("input", () => {
  $("key-error").textContent = ""; // a new key: the old reason no longer holds
  if (apiKey()) localStorage.setItem(KEY_STORAGE, apiKey());
  else localStorage.removeItem(KEY_STORAGE);
});
$("talk").addEventListener("click", () => (transport ? stop() : start()));
$("camera").addEventListener("click", () => { if (transport) shareFrame(); });
page.ready = true;
