"""Deploy profiles: placement and tuning of the stages, plus server settings.

A profile is YAML validated once into frozen pydantic models. Unknown keys and ill-typed values
fail with a message naming the key, so a typo never silently falls back to a default.
The pipeline topology (thinker -> talker -> code2wav) lives in code, not here.
"""

from __future__ import annotations

import ipaddress
import multiprocessing
import re
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from omnivoice.types import STAGES, Grammar, Sampling


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SamplingDefaults(_Strict):
    """Per-stage sampling defaults; a request may override temperature/top_p/max tokens. The talker's
    tokens are codec frames: its max_tokens and min_tokens count frames of audio (80 ms each)."""

    temperature: float = Field(0.0, ge=0.0, le=5.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = Field(0, ge=0)
    repetition_penalty: float = Field(1.0, gt=0.0)
    max_tokens: int = Field(256, ge=1)

    def for_request(
        self,
        *,
        max_tokens: int | None = None,
        min_tokens: int = 0,
        temperature: float | None = None,
        top_p: float | None = None,
        seed: int | None = None,
        grammar: Grammar | None = None,
    ) -> Sampling:
        """A request's sampling: these defaults, with what the request sets (None keeps the default)."""
        return Sampling(
            temperature=self.temperature if temperature is None else temperature,
            top_p=self.top_p if top_p is None else top_p,
            top_k=self.top_k,
            repetition_penalty=self.repetition_penalty,
            max_tokens=self.max_tokens if max_tokens is None else max_tokens,
            min_tokens=min_tokens,
            seed=seed,
            grammar=grammar,
        )


class ChunkConfig(_Strict):
    """How the talker's codec frames are cut into vocoder chunks (async chunk)."""

    first_frames: int = Field(4, ge=1, description="frames in the first chunk (small: fast first audio)")
    frames: int = Field(25, ge=1, description="frames in every later chunk")
    left_context: int = Field(25, ge=0, description="frames of left context decoded and discarded")
    ramp: bool = Field(
        True,
        description="double the chunk size after the first (4, 8, 16, 25, 25...) so the second chunk "
        "arrives before the first has played out; false: first_frames, then frames",
    )
    catch_up: bool = Field(
        True,
        description="decode the frames that have come (at least first_frames) instead of waiting for "
        "the whole chunk when, at the rate the stream's frames arrive, the rest would come after its "
        "playback ran dry (only while the stream's frames come faster than real time)",
    )


class StageConfig(_Strict):
    device: str = "cpu"
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    max_batch: int = Field(8, ge=1)
    max_queue: int = Field(
        32,
        ge=0,
        description="requests that may wait beyond max_batch for one replica of this stage; a new request "
        "that would exceed max_batch + max_queue on its replica is refused at once (EngineOverloaded: 503)",
    )
    execution: Literal["eager", "cuda_graph"] = Field(
        "eager",
        description="cuda_graph: capture each decode step (per batch-size and KV-length bucket), the "
        "code predictor's frame and each Code2Wav forward (per batch-size bucket and window length) as "
        "CUDA graphs at start, then replay them (CUDA devices only)",
    )
    graphs_at_start: int | None = Field(
        None,
        ge=1,
        description="execution cuda_graph: the widest batch bucket whose graphs are captured (Code2Wav's: "
        "tuned by cuDNN and captured) before the stage is ready; the wider ones are captured afterwards, "
        "narrowest first, "
        "whenever the stage is idle, and a step that needs one not captured yet captures it first (once). "
        "Smaller: the stage is ready sooner. null: every bucket before it is ready",
    )
    compile: bool = Field(
        True,
        description="CUDA devices: torch.compile each decoder layer's decode-step math (thinker, talker, "
        "code predictor) and Code2Wav's activations into a few fused kernels, at start; falls back to "
        "eager, with a warning, if compiling fails. false: no torch.compile at all",
    )
    overlap: bool | None = Field(
        None,
        description="thinker and talker: queue each step before the previous step's tokens are read back, "
        "so the host's work on one step runs while the device computes the next (a request that samples "
        "its end token costs one dropped row). Default (null): on for CUDA devices, off on the CPU, where "
        "nothing runs ahead of the host",
    )
    fused_prefill: bool = Field(
        True,
        description="thinker and talker on CUDA devices: prompts through the same fused, compiled layers as "
        "decode steps instead of transformers' modules (fewer kernel launches, so a prompt's first token "
        "comes sooner and a burst of prompts holds up the other streams' decoding for less). The kinds of "
        "prompt batch it compiles are compiled at start, which lengthens it; false: transformers' modules",
    )
    # process: true parallelism across cores (the CPU default); thread: one process, one model copy;
    # ray: each replica a Ray actor, anywhere on the cluster of the profile's `ray` section
    worker: Literal["thread", "process", "ray"] = "process"
    replicas: int = Field(1, ge=1, description="workers of this stage; a request sticks to one of each")
    devices: tuple[str, ...] | None = Field(
        None, description="one device per replica (e.g. [cuda:1, cuda:2]); default: every replica on `device`"
    )
    threads: int = Field(1, ge=1, description="torch intra-op threads in this stage's worker")
    max_seq_len: int = Field(4096, ge=64, description="KV cache length per request")
    sampling: SamplingDefaults = SamplingDefaults()

    @model_validator(mode="after")
    def _check_devices(self) -> StageConfig:
        if self.devices is not None and len(self.devices) != self.replicas:
            raise ValueError(f"devices lists {len(self.devices)} devices for {self.replicas} replicas")
        return self

    @model_validator(mode="after")
    def _check_execution(self) -> StageConfig:
        if self.execution == "cuda_graph":
            devices = self.devices if self.devices is not None else (self.device,)
            cpu = [d for d in devices if not d.startswith("cuda")]
            if cpu:
                raise ValueError(f"execution cuda_graph needs CUDA devices, not {', '.join(cpu)}")
        return self

    def replica_device(self, replica: int) -> str:
        return self.devices[replica] if self.devices is not None else self.device


class ThinkerStage(StageConfig):
    sampling: SamplingDefaults = SamplingDefaults(temperature=0.0, max_tokens=256)
    prefix_cache_entries: int = Field(
        16, ge=0, description="conversations whose KV is kept between turns (one spare KV slot each)"
    )
    max_prefill_tokens: int = Field(
        4096,
        ge=64,
        description="prompt tokens prefilled in one step (several new requests together); larger: a burst "
        "of requests gets its first tokens sooner, smaller: running requests' decode steps wait less",
    )
    audio_windows_per_step: int = Field(
        16,
        ge=1,
        description="attention windows of the audio encoder (n_window_infer log-mel frames each: 8 s of "
        "speech for Qwen3-Omni) encoded per step, in one padded forward, for the waiting requests' audio "
        "and speech encoded while it is spoken; a request is prefilled once its audio is encoded. Larger: "
        "a burst of long utterances is encoded sooner, smaller: running requests' decode steps wait less",
    )
    grammar_timeout_s: float = Field(
        2.0,
        gt=0,
        description="longest compile of one request's grammar (response_format schema, required tool "
        "call), in a worker process before the request reaches the thinker; a costlier one is refused "
        "(chat: 400 invalid_schema; realtime: an error event)",
    )
    grammar_memory_mb: int = Field(
        512, ge=64, description="memory one grammar's compile may take in its worker; past it it is refused"
    )
    grammar_cache_entries: int = Field(
        256, ge=1, description="grammars whose verdict (usable, or why not) is kept, by their text"
    )


class TalkerStage(StageConfig):
    sampling: SamplingDefaults = SamplingDefaults(
        temperature=0.0, top_k=50, repetition_penalty=1.05, max_tokens=2048
    )  # max_tokens: the hard cap on an answer's codec frames (12.5 per second of audio)
    frames_per_text_token: float | None = Field(
        6.0,
        gt=0,
        description="once an answer's text is complete, its audio may run to this many codec frames "
        "(12.5 per second) per text token, plus extra_frames; past that the talker stops and the "
        "response ends as cut at a length limit (finish_reason length, realtime status incomplete). "
        "Speech takes about 4 frames per token, so a talker that never samples its end code stops near "
        "where its speech should have. A request's own frame minimum (min_audio_frames, "
        "output_audio_frames) still applies. null: only sampling.max_tokens bounds the audio",
    )
    extra_frames: int = Field(
        25, ge=0, description="codec frames allowed beyond frames_per_text_token x text tokens"
    )
    predictor_kernels: bool | None = Field(
        None,
        description="the code predictor's layers as Triton kernels, five per layer with the norms, rope, "
        "KV writes and residuals fused in, and each step's sampling and embedding gather as one kernel "
        "(faster frames than the compiled torch layers: see BENCHMARKS.md). Default "
        "(null): on for CUDA devices where Triton is installed and the model is bfloat16 or float16; "
        "true: required (an error otherwise); false: the torch layers",
    )


class Code2WavStage(StageConfig):
    chunk: ChunkConfig = ChunkConfig()
    cudnn_tune_from_batch: int = Field(
        1,
        ge=1,
        description="CUDA devices: batch buckets from this size on have cuDNN time its convolution "
        "algorithms for each window length at start (the fastest kept for serving); smaller ones take "
        "cuDNN's heuristic choice, which starts sooner. Above max_batch: no timing at all",
    )
    cudnn_benchmark_limit: int = Field(
        3,
        ge=0,
        description="CUDA devices: convolution algorithms cuDNN times per shape when it tunes (torch's "
        "cudnn.benchmark_limit; fewer start sooner, 0: all of them). Three keep the steps within a few "
        "per cent of timing ten (torch's default) for a third of the start (BENCHMARKS.md)",
    )


class PriorityConfig(_Strict):
    """First audio first: how the stages order their work by where each request's playback stands.

    A request's slack is the audio a stage has produced for it minus the time since its first audio
    left the engine. FIRST (no audio yet) and DRY (slack under `low_watermark_s`) work goes ahead of
    NORMAL work, which goes ahead of AHEAD work (slack over `high_watermark_s`)."""

    enabled: bool = Field(
        True,
        description="order admission and steps by playback state, and let stages whose work is all AHEAD "
        "give way to FIRST or DRY work elsewhere on their device; false: arrival order, no yielding",
    )
    low_watermark_s: float = Field(
        0.5,
        description="slack (seconds of audio ahead of playback) under which a request is DRY (negative: "
        "only once it is that far behind)",
    )
    high_watermark_s: float = Field(
        2.0, description="slack over which a request is AHEAD and may wait for FIRST or DRY work"
    )
    yield_ms: float = Field(
        2.0, gt=0.0, description="a stage whose work is all AHEAD waits this long per step it gives way"
    )
    max_yield_ms: float = Field(
        40.0,
        ge=0.0,
        description="longest a stage gives way in a row before it steps anyway (AHEAD work is never starved)",
    )

    @model_validator(mode="after")
    def _check_watermarks(self) -> PriorityConfig:
        if self.high_watermark_s <= self.low_watermark_s:
            raise ValueError("high_watermark_s must be above low_watermark_s")
        return self


class CapacityConfig(_Strict):
    """Admission from measured capacity: the engine fits each stage's step time against its batch size
    from its own steps, and admits a new audio stream only while every stage would still keep up with
    real time with one more (the fixed limits, max_batch + max_queue, max_sessions and
    max_concurrent_requests, stay upper bounds)."""

    enabled: bool = Field(
        True,
        description="refuse streams that the measured capacity cannot serve in real time; false: the fixed "
        "limits only",
    )
    headroom: float = Field(
        0.8,
        gt=0.0,
        le=1.0,
        description="share of real time a stage's steps may take at the admitted load (the rest absorbs "
        "prefills, jitter and what the fit does not see)",
    )
    min_steps: int = Field(
        20, ge=1, description="steps a stage must have measured before its estimate limits admission"
    )
    min_slack_s: float = Field(
        0.0,
        description="while an admitted stream's audio is less than this far ahead of real time since its "
        "first audio (below 0: a player started at the first chunk has run dry), no new stream is admitted",
    )
    calibrate: bool | None = Field(
        None,
        description="before serving, time each stage's decode steps at every batch bucket (1, 2, 4, ... "
        "up to the narrowest max_batch) with a short burst of requests, so the capacity is known before "
        "the first request (served steps then refine it). Default (null): on when the thinker runs on a "
        "CUDA device; off while measured admission is off",
    )
    reuse_calibration: bool = Field(
        True,
        description="keep each calibration's step times under model.cache_dir, and on a start of the same "
        "model, stage settings, torch version and devices use them instead of calibrating again (served "
        "steps then refine them); false: calibrate at every start",
    )


class StagesConfig(_Strict):
    thinker: ThinkerStage = ThinkerStage()
    talker: TalkerStage = TalkerStage()
    code2wav: Code2WavStage = Code2WavStage()
    priority: PriorityConfig = PriorityConfig()
    capacity: CapacityConfig = CapacityConfig()
    warm_burst: bool | None = Field(
        None,
        description="before serving, one burst of short requests as wide as the narrowest stage's "
        "max_batch, so that the first full batch of prompts does not pay first-time costs (allocator "
        "growth, kernel set-up for new shapes) while users wait. Default (null): on when the thinker "
        "runs on a CUDA device",
    )
    start_method: Literal["spawn", "forkserver"] | None = Field(
        None,
        description="how stage processes (worker: process) are started. spawn: each is a fresh "
        "interpreter that imports torch, transformers and the runners itself; forkserver: each is forked "
        "from multiprocessing's forkserver, one process that imported them once, started at the "
        "beginning of the engine's start, so a start (and a restart of the stages) skips those imports. "
        "Default (null): "
        "forkserver where the platform has it, else spawn",
    )
    core: Literal["in_process", "process"] = Field(
        "in_process",
        description="where the engine core (the pipeline, its dispatcher, the supervisor, measured "
        "capacity) runs. in_process: in the server's process, beside the event loop. process: in a process "
        "of its own, which starts the stages; the server keeps an engine client (prompts, grammar checks) "
        "that the core's outputs and figures are pushed to, so no core work shares the server's "
        "interpreter, and a core that dies or is stuck fails its requests and is restarted while the "
        "sessions stay connected",
    )
    mps: Literal["auto", "on", "off"] = Field(
        "auto",
        description="CUDA MPS for stage processes (worker: process) that share a GPU: their kernels run "
        "on its SMs at once instead of taking turns in time slices. The engine starts an MPS control "
        "daemon of its own for them (or uses one already running for the machine) and quits it when "
        "the stages stop. auto: where stage processes share a CUDA device and nvidia-cuda-mps-control "
        "is on PATH, else (or if it fails) a warning and time slices; on: no MPS is a start error; "
        "off: never",
    )
    stuck_after_s: float = Field(
        120.0,
        ge=0,
        description="a stage worker that reports nothing for this long (one step that never ends: a "
        "GPU kernel that hangs, a wait never met) is stuck: its requests fail, a stage process is "
        "killed and restarted, a stage thread ends the server for its supervisor (exit code 70). "
        "Likewise when requests are in flight and none of them gets any output for this long (the "
        "workers report, but no step moves): every stage restarts, or the server exits if a stage is "
        "a thread. 0: never",
    )

    @field_validator("start_method")
    @classmethod
    def _check_start_method(cls, method: str | None) -> str | None:
        if method is not None and method not in multiprocessing.get_all_start_methods():
            raise ValueError(f"this platform cannot start processes by {method}")
        return method

    def process_start_method(self) -> Literal["spawn", "forkserver"]:
        """How stage processes are started (`start_method`, null resolved)."""
        if self.start_method is not None:
            return self.start_method
        return "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn"

    def warms_burst(self) -> bool:
        """Whether the engine runs the warm-up burst before serving (`warm_burst`, null resolved)."""
        if self.warm_burst is not None:
            return self.warm_burst
        return self._cuda_thinker()

    def _cuda_thinker(self) -> bool:
        return any(d.startswith("cuda") for d in (self.thinker.device, *(self.thinker.devices or ())))

    def calibrates(self) -> bool:
        """Whether the engine calibrates its capacity before serving (`capacity.calibrate`, null
        resolved)."""
        if not self.capacity.enabled:
            return False
        return self._cuda_thinker() if self.capacity.calibrate is None else self.capacity.calibrate

    def stage(self, name: str) -> StageConfig:
        """The settings of stage `name` (thinker, talker or code2wav)."""
        stages: dict[str, StageConfig] = {
            "thinker": self.thinker,
            "talker": self.talker,
            "code2wav": self.code2wav,
        }
        if name not in stages:
            raise KeyError(f"no stage named {name!r}")
        return stages[name]


# `model.path: "dummy:<name>"` builds that architecture at full size with random weights (no checkpoint,
# no tokenizer: requests carry token ids); see omnivoice/models/dummy.py.
DUMMY_PREFIX = "dummy:"
DUMMY_MODELS = ("qwen3-omni-30b-a3b",)


class ModelConfig(_Strict):
    path: str | None = Field(
        None,
        description="local Hugging Face checkpoint folder, or dummy:<name> (random weights, full size); "
        "null builds the tiny embedded default",
    )
    cache_dir: str | None = Field(
        None,
        description="where the embedded default and a dummy model's tokenizer are built "
        "(default ~/.cache/omnivoice)",
    )
    served_name: str = "omnivoice"
    default_voice: str = "ethan"
    system_prompt: str | None = None

    @field_validator("path")
    @classmethod
    def _check_dummy(cls, path: str | None) -> str | None:
        if path is not None and path.startswith(DUMMY_PREFIX):
            name = path[len(DUMMY_PREFIX) :]
            if name not in DUMMY_MODELS:
                raise ValueError(f"unknown dummy model {name!r}; known: {', '.join(DUMMY_MODELS)}")
        return path


class ServerConfig(_Strict):
    host: str = "127.0.0.1"
    port: int = Field(8000, ge=0, le=65535)
    front_ends: int = Field(
        1,
        ge=1,
        le=64,
        description="processes that serve the port together, each with its own event loop, front door "
        "(VAD, resampling, log-mel, codecs) and sessions, all sharing one engine core (stages.core: "
        "process): a connection is served by the process that accepted it. A supervisor process owns "
        "the port, the core and the front ends. Admission, realtime.max_sessions and the per-key limits "
        "hold for the whole server; /metrics and /v1/debug/state cover every front end",
    )
    max_concurrent_requests: int = Field(
        64,
        ge=1,
        description="chat requests and realtime responses in flight at once; more are refused at once "
        "(503 with Retry-After; a realtime response.create gets an error event), never queued",
    )
    max_body_bytes: int = Field(
        25 * 1024 * 1024, ge=1024, description="request bodies larger than this get 413 (chunked ones too)"
    )
    max_json_elements: int = Field(
        200_000,
        ge=100,
        description="values one request body or realtime event may hold, counted before parsing by its "
        "'[', '{' and ',' characters (those inside strings too); past it: 413 json_too_complex (realtime: "
        "an error event, json_too_complex)",
    )
    max_json_depth: int = Field(
        64, ge=8, description="nesting of one request body or realtime event; deeper: as max_json_elements"
    )
    max_audio_seconds: float = Field(120.0, gt=0, description="longest input audio per content part")
    max_image_pixels: int = Field(
        4096 * 4096, ge=1, description="largest input image (width x height) per content part; larger get 400"
    )
    max_request_image_pixels: int = Field(
        4 * 4096 * 4096,
        ge=1,
        description="pixels (width x height, read from each image's header before any is decoded) of all "
        "the images of one chat request; past it the request gets 400 (image_budget_exceeded)",
    )
    memory_trim_interval_s: float = Field(
        10.0,
        ge=0,
        description="how often the server checks its resident memory and, grown by more than 32 MB since "
        "the last trim, returns the allocator's free pages to the system (malloc_trim); 0: never",
    )
    audio_workers: int = Field(
        2,
        ge=0,
        description="threads of the front door, which decodes, resamples and scores (Silero VAD, a "
        "spoken turn's log-mel) the input audio of every realtime session: each takes all the appends "
        "pending at once and scores them as one batch; 0: each append alone in its own worker-thread "
        "call (the per-session path)",
    )
    audio_batch_ms: float = Field(
        3.0,
        ge=0,
        le=10,
        description="how long an append waits for other sessions' appends to join its batch (when the "
        "front door is idle; a busy one batches what queued meanwhile): fewer, larger batches cost "
        "less CPU, each append this much later. Below a client's append interval (10-20 ms), or a "
        "session that fell behind could not catch up",
    )
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    send_timeout_s: float = Field(
        10.0,
        gt=0,
        description="a client that takes no data for this long is dropped (SSE streams, realtime and "
        "Twilio WebSockets, WebRTC data channels) and its engine request aborted",
    )
    drain_timeout_s: float = Field(
        30.0,
        ge=0,
        description="on SIGTERM/SIGINT: how long in-flight responses may finish (nothing new is admitted) "
        "before the rest are cancelled with a notice and the server exits",
    )
    header_timeout_s: float = Field(
        10.0,
        gt=0,
        description="a connection must send a request's complete headers within this, from when it opens "
        "or its previous response ends; else it is closed (408 if part of a request came)",
    )
    body_timeout_s: float = Field(
        60.0, gt=0, description="a request's whole body must arrive within this after its headers; else 408"
    )
    max_connections_per_client: int | None = Field(
        128,
        ge=1,
        description="open connections (HTTP and WebSocket) from one client address; more are closed at "
        "once. Trusted proxies (trusted_proxies) are exempt; null: no limit",
    )
    ws_per_message_deflate: bool = Field(
        False,
        description="offer permessage-deflate to WebSocket clients (realtime, Twilio). Off: outgoing audio "
        "is base64 PCM or G.711, which deflate shrinks little, while compressing every frame costs the "
        "event loop that serves all sessions",
    )
    trusted_proxies: list[str] = Field(
        default_factory=list,
        description="addresses or networks (127.0.0.1, 10.0.0.0/8) of reverse proxies whose "
        "X-Forwarded-For and X-Forwarded-Proto are believed; from anyone else they are ignored",
    )

    @field_validator("trusted_proxies")
    @classmethod
    def _check_proxies(cls, proxies: list[str]) -> list[str]:
        for proxy in proxies:
            try:
                ipaddress.ip_network(proxy, strict=False)
            except ValueError:
                raise ValueError(f"{proxy!r} is not an IP address or network") from None
        return proxies


class RealtimeConfig(_Strict):
    """`/v1/realtime` sessions: limits and output pacing."""

    max_sessions: int = Field(
        32, ge=1, description="realtime sessions open at once: WebSockets, WebRTC calls and phone calls"
    )
    max_buffer_seconds: float = Field(
        60.0,
        gt=0,
        description="input audio buffer per session (at most server.max_audio_seconds: a committed buffer "
        "is one audio part)",
    )
    idle_timeout_s: float = Field(600.0, gt=0, description="close a session this long without events")
    max_audio_ahead_ms: int = Field(1000, ge=0, description="audio sent ahead of real-time playback")
    speculative_response: bool = Field(
        True,
        description="server VAD: start a turn's response as soon as the speech pauses, holding all of "
        "it until silence_duration_ms confirms the turn, and abort it if the caller speaks again first; "
        "a session may turn it off (session.omnivoice.speculative_response)",
    )
    speculative_pause_ms: int = Field(
        96,
        ge=0,
        description="server VAD: silence after speech that counts as a pause and starts a speculative "
        "response; the shorter gaps between words start none (each would be started and dropped)",
    )
    transcription_max_tokens: int = Field(
        256,
        ge=1,
        description="longest transcript of one caller turn (audio.input.transcription), in text tokens",
    )
    webrtc_connect_timeout_s: float = Field(
        15.0, gt=0, description="close a WebRTC call not connected (ICE + DTLS) this long after the answer"
    )
    max_event_bytes: int = Field(
        15 * 1024 * 1024,
        ge=1024,
        description="largest client event; a larger one gets an error event (event_too_large) and the "
        "session goes on; a WebSocket frame over twice this is refused by the protocol layer (close 1009)",
    )
    max_conversation_items: int = Field(
        2000,
        ge=2,
        description="items one session's conversation holds; past it a conversation.item.create gets an "
        "error event (conversation_full), while the server's own items (turns, responses) drop the oldest "
        "(conversation.item.deleted)",
    )
    max_session_image_pixels: int = Field(
        4 * 4096 * 4096,
        ge=1,
        description="pixels (width x height, read from each image's header) of all input_image items one "
        "session holds; past it a conversation.item.create gets an error event (image_budget_exceeded)",
    )
    max_outbox_bytes: int = Field(
        8 * 1024 * 1024,
        ge=64 * 1024,
        description="server events (mostly audio) queued for a client that does not read them; over it "
        "the client is dropped (close 1008) and its response aborted. Keep it above the audio sent ahead "
        "plus one vocoder chunk (2 s of pcm16 is ~128 KB of base64)",
    )
    turn_model_threads: int = Field(
        2,
        ge=1,
        description="semantic_vad: CPU threads of one run of the end-of-turn model (Smart Turn), which "
        "scores the pauses of all sessions that pause together as one batch",
    )
    turn_model_runs: int = Field(
        0,
        ge=0,
        description="semantic_vad: runs of the end-of-turn model at once, each on its own share of the "
        "pauses waiting (its cost grows with the batch, so many callers pausing together are split "
        "over several runs); 0: one per four CPU cores",
    )


class TelephonyConfig(_Strict):
    """`/v1/telephony/twilio`: phone calls over Twilio Media Streams, each a realtime session."""

    public_url: str | None = Field(
        None,
        pattern=r"^wss?://[^/\s]+$",
        description="ws(s)://host[:port] the carrier reaches this server at, for the TwiML; "
        "null: wss:// and the Host of the TwiML request",
    )
    max_audio_ahead_ms: int = Field(200, ge=20, description="audio sent ahead of playback at the carrier")


class RateLimitConfig(_Strict):
    """Per API key (a client secret counts against the key that minted it); null: no limit."""

    requests_per_minute: int | None = Field(
        default=None, ge=1, description="HTTP requests and realtime connections per minute (a token bucket)"
    )
    burst: int | None = Field(
        default=None, ge=1, description="bucket size: requests at once (null: requests_per_minute)"
    )
    max_sessions: int | None = Field(
        default=None, ge=1, description="realtime sessions open at once (WebSocket, WebRTC and phone calls)"
    )


class AuthConfig(_Strict):
    """API keys, client secrets, browser origins and per-key limits (omnivoice/server/auth).

    The keys come from the OMNIVOICE_API_KEY environment variable (comma-separated) and/or
    `api_key_file`; never from the profile itself, so profiles can be committed."""

    api_key_file: str | None = Field(
        default=None,
        description="file of API keys, one per line (# comments); relative to the working directory",
    )
    public_metrics: bool = Field(
        default=False, description="serve /metrics without a key (for a Prometheus scrape)"
    )
    allowed_origins: list[str] = Field(
        default_factory=list,
        description="browser origins (scheme://host[:port]) allowed besides the server's own; '*' for any",
    )
    allowed_hosts: list[str] = Field(
        default_factory=list,
        description="host names (no port) the server answers to besides localhost, IP addresses, the host "
        "it is bound to, telephony.public_url's and allowed_origins' hosts: without a key other Hosts get "
        "421, with one their pages are not same-origin (DNS rebinding). '*': any (only behind a proxy "
        "that checks Host)",
    )
    allow_unauthenticated_remote: bool = Field(
        default=False,
        description="with no key configured, still bind a non-loopback host (anyone can use it)",
    )
    rate_limit: RateLimitConfig = RateLimitConfig()
    max_failed_auth_per_minute: int | None = Field(
        default=30,
        ge=1,
        description="failed authentication attempts per minute from one client address; over it the "
        "address gets 429 (even with a right key) until it recovers. null: no limit (behind a proxy, "
        "where every client shares its address, throttle there)",
    )

    @field_validator("allowed_origins")
    @classmethod
    def _check_origins(cls, origins: list[str]) -> list[str]:
        for origin in origins:
            if origin != "*" and not re.fullmatch(r"https?://[^/\s]+", origin):
                raise ValueError(f"{origin!r} is not an origin (scheme://host[:port], no path) or '*'")
        return [o.lower() for o in origins]

    @field_validator("allowed_hosts")
    @classmethod
    def _check_hosts(cls, hosts: list[str]) -> list[str]:
        for host in hosts:
            if host != "*" and not re.fullmatch(r"[A-Za-z0-9_.-]+", host):
                raise ValueError(f"{host!r} is not a host name (no scheme, port or path) or '*'")
        return [h.lower() for h in hosts]


class RayConfig(_Strict):
    """The Ray cluster that `worker: ray` stages run on (only read when a stage has `worker: ray`)."""

    address: str | None = Field(
        None,
        description="null: start a private local cluster (stopped with the server); auto, host:port or "
        "ray://host:port: attach to a running cluster",
    )
    namespace: str = Field("omnivoice", min_length=1, description="Ray namespace of the stage actors")


class Profile(_Strict):
    model: ModelConfig = ModelConfig()
    server: ServerConfig = ServerConfig()
    realtime: RealtimeConfig = RealtimeConfig()
    telephony: TelephonyConfig = TelephonyConfig()
    stages: StagesConfig = StagesConfig()
    ray: RayConfig = RayConfig()
    auth: AuthConfig = AuthConfig()

    @model_validator(mode="after")
    def _check(self) -> Profile:
        workers = {name: self.stages.stage(name).worker for name in STAGES}
        if "ray" in workers.values() and "process" in workers.values():
            # with a ray stage every connector is a Ray queue, which a spawned process cannot reach
            process = next(name for name, w in workers.items() if w == "process")
            raise ValueError(f"stages.{process}.worker: process cannot be mixed with ray (use thread)")
        c = self.stages.code2wav.chunk
        if c.first_frames > c.frames:
            raise ValueError("stages.code2wav.chunk.first_frames must be <= frames")
        if self.server.front_ends > 1 and self.stages.core != "process":
            raise ValueError(
                "server.front_ends > 1 needs stages.core: process (the front ends share its core)"
            )
        return self


class ProfileError(ValueError):
    """A profile file that cannot be used; the message names the offending key."""


def _format_errors(err: ValidationError, source: str) -> str:
    lines = [f"invalid profile {source}:"]
    for e in err.errors():
        key = ".".join(str(p) for p in e["loc"]) or "<root>"
        msg = "unknown key" if e["type"] == "extra_forbidden" else e["msg"]
        lines.append(f"  {key}: {msg}")
    return "\n".join(lines)


def parse_profile(data: object, source: str = "<dict>") -> Profile:
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ProfileError(f"invalid profile {source}: top level must be a mapping")
    try:
        return Profile.model_validate(data)
    except ValidationError as err:
        raise ProfileError(_format_errors(err, source)) from None


def load_profile(path: str | Path | None) -> Profile:
    """Load and validate a YAML profile; `None` gives the built-in CPU default."""
    if path is None:
        return Profile()
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as e:
        raise ProfileError(f"cannot read profile {p}: {e.strerror}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ProfileError(f"profile {p} is not valid YAML: {e}") from None
    return parse_profile(data, str(p))
