"""The shared vocabulary: the stage names, what a caller submits to the engine and what it gets back.

Every layer imports these (models, runners, engine, server); they import nothing of omnivoice.
Messages between the engine and its stage workers are in `omnivoice.messages`.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

import numpy as np

StageName = Literal["thinker", "talker", "code2wav"]
# The pipeline's stages in data order; everything that lists stages derives from this.
STAGES: tuple[StageName, ...] = get_args(StageName)


@dataclass(frozen=True)
class TextPart:
    text: str


@dataclass(frozen=True)
class AudioPart:
    """Mono float32 PCM in [-1, 1] at `sample_rate`; the prompt builder resamples to the model's rate.

    `features`: the clip's log-mel features [n_mels, frames] float32, when they were computed already
    (a conversation keeps them with its audio); the prompt builder then uses them as they are."""

    pcm: np.ndarray
    sample_rate: int
    features: np.ndarray | None = None


@dataclass(frozen=True)
class ImagePart:
    """An image: decoded RGB pixels [H, W, 3] uint8 (`rgb`), or its encoded file (`data`, PNG, JPEG
    or WebP) with the `width` and `height` its header gives. The prompt builder resizes and patches
    it; an encoded image is decoded there, one at a time, only once the placeholder tokens its size
    makes are known to fit the prompt, so only its bytes are held meanwhile."""

    rgb: np.ndarray | None = None
    data: bytes = b""
    width: int = 0
    height: int = 0

    @property
    def shape(self) -> tuple[int, int]:
        """(height, width) in pixels."""
        if self.rgb is not None:
            return int(self.rgb.shape[0]), int(self.rgb.shape[1])
        return self.height, self.width


@dataclass(frozen=True)
class FunctionSpec:
    """A function the model may call: its name, what it does, and a JSON schema of its arguments.

    Rendered into the prompt as the chat template renders an OpenAI tool: `{"type": "function",
    "function": {"name", "description", "parameters"}}`, leaving out what is None.
    """

    name: str
    description: str | None = None
    parameters: Mapping[str, Any] | None = field(default=None, hash=False)  # a JSON schema object


@dataclass(frozen=True)
class ToolCall:
    """A call of a function by the model: `arguments` is the JSON text of the arguments object, as the
    model wrote it; `id` pairs the call with the tool message that answers it."""

    id: str
    name: str
    arguments: str


@dataclass(frozen=True)
class Tools:
    """The functions a request offers the model, and how it must use them.

    choice "auto": the model may answer or call functions; "required": it must call at least one;
    with `function` set it must call that one. `parallel`: it may call several in one response.
    """

    functions: tuple[FunctionSpec, ...]
    choice: Literal["auto", "required"] = "auto"
    function: str | None = None
    parallel: bool = True


@dataclass(frozen=True)
class ChatMessage:
    """One turn of a conversation.

    An assistant turn may hold the calls it made (`tool_calls`, its text parts then optional); a
    `tool` turn is a function's result, text only, answering the call `tool_call_id`.
    """

    role: Literal["system", "user", "assistant", "tool"]
    parts: tuple[TextPart | AudioPart | ImagePart, ...]
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None


@dataclass(frozen=True)
class Grammar:
    """A constraint on what the thinker may write, enforced token by token while decoding.

    `kind` says how `source` reads: "lark" is a Lark grammar in llguidance's dialect (JSON schemas may
    be embedded with `%json{...}`), "json_schema" a JSON schema as text, "regex" a regular expression.
    """

    kind: Literal["lark", "json_schema", "regex"]
    source: str


@dataclass(frozen=True)
class Sampling:
    """Sampling for one stage of one request. temperature 0 means greedy. For the talker, max_tokens
    and min_tokens count codec frames: N gives N frames of audio (80 ms each)."""

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    repetition_penalty: float = 1.0
    max_tokens: int = 256
    min_tokens: int = 0
    seed: int | None = None
    # thinker only: decoding is constrained to this grammar (tool_choice "required", response_format)
    grammar: Grammar | None = None


@dataclass(frozen=True)
class Prompt:
    """A tokenized prompt: thinker token ids, one log-mel feature matrix per audio placeholder run and
    the vision patches of each image placeholder run."""

    input_ids: tuple[int, ...]
    # each [n_mels, frames] float32, in the order the audio placeholder runs appear in input_ids
    audio_features: tuple[np.ndarray, ...] = ()
    # each [patches, 3 * temporal_patch * patch * patch] float32, in the order of the image runs
    image_patches: tuple[np.ndarray, ...] = ()
    # each image's patch grid (t, h, w): its run holds t * h * w / merge_size**2 placeholders
    image_grids: tuple[tuple[int, int, int], ...] = ()


@dataclass(frozen=True)
class GenerationRequest:
    request_id: str
    prompt: Prompt
    want_audio: bool = True
    voice: str = "ethan"
    thinker: Sampling = Sampling()
    talker: Sampling = Sampling(max_tokens=2048)
    # Conversation key for the thinker's prefix cache: the next request with the same key prefills only
    # what its prompt adds to this one's prompt and answer (sessions set it; one-off requests don't).
    cache_key: str | None = None
    # Replica of each stage (thinker, talker, code2wav) serving this request; the engine sets it.
    route: tuple[int, int, int] = (0, 0, 0)
    # Only prefill the prompt into the prefix cache (early start while the user speaks); no output.
    prefill_only: bool = False
    # Functions the model may call: its text is then split into what it says (TextDelta) and the
    # calls it writes (ToolCallDelta, ToolCallDone); None: its text is all said.
    tools: Tools | None = None


@dataclass(frozen=True)
class TextDelta:
    request_id: str
    token_ids: tuple[int, ...]
    text: str


@dataclass(frozen=True)
class ToolCallDelta:
    """A piece of a function call as the thinker writes it. A call's first piece has its `call_id`,
    `name` and empty `arguments`; the next ones add argument text (concatenated, they are the
    arguments' JSON text). `index` numbers the response's calls from 0."""

    request_id: str
    index: int
    call_id: str
    name: str | None
    arguments: str


@dataclass(frozen=True)
class ToolCallDone:
    """A function call the thinker finished writing. `error` says why its text is not a call of the
    form the prompt asks for (not JSON, no name, cut short...): `call` then holds what was written."""

    request_id: str
    index: int
    call: ToolCall
    error: str | None = None


@dataclass(frozen=True)
class AudioChunk:
    """A piece of the response's audio: float32 mono PCM at `sample_rate`, gap-free with its neighbours."""

    request_id: str
    index: int
    pcm: np.ndarray
    sample_rate: int
    first_audio: FirstAudio | None = None  # on a request's first chunk: where its wait went


@dataclass(frozen=True)
class FirstAudio:
    """Where a request's time to its first audio went, in ms, stage by stage (they add up to about
    the whole: the first text token and the talker's start overlap by the thinker's hand-off)."""

    to_first_token_ms: float  # queued, the thinker's prefill and its first token, at the engine
    to_talker_ms: float  # from the first token until the talker took the request
    talker_frames_ms: float  # the talker's prefill and the frames of the first chunk
    to_code2wav_ms: float  # from those frames until Code2Wav began their decode
    decode_ms: float  # Code2Wav's decode of the first chunk
    to_engine_ms: float  # from the decode's end until the engine had the audio


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    audio_frames: int = 0
    cached_tokens: int = 0  # of prompt_tokens, those served from the conversation's cached prefix


FinishReason = Literal["stop", "length", "abort", "error"]


@dataclass(frozen=True)
class Finished:
    """Last output of a request. finish_reason: stop | length | abort | error; `out_of_memory`: the
    error was a step that ran out of GPU memory (the same request may go through later, or narrower)."""

    request_id: str
    finish_reason: FinishReason
    usage: Usage = field(default_factory=Usage)
    error: str | None = None
    out_of_memory: bool = False


EngineOutput = TextDelta | ToolCallDelta | ToolCallDone | AudioChunk | Finished


class PromptTooLong(ValueError):
    """The messages cannot fit the thinker's context, known before they are all tokenized (their
    images' placeholder tokens alone are too many); a user-facing message."""


class EngineOverloaded(Exception):
    """`Engine.generate` refused a request at once: a stage replica already holds `max_batch +
    max_queue` requests. Nothing was started; the caller should answer "retry later" (503)."""


class EngineUnavailable(RuntimeError):
    """`Engine.generate` refused a request at once: the engine's stages stopped (a worker died, a
    device fault, a stuck stage) and are restarting, or could not be restarted. The message is the
    engine's `failure`; nothing was started; the caller should answer "unavailable" (503)."""


@dataclass(frozen=True)
class StageStats:
    name: str
    queued: int
    running: int
    last_batch_size: int
    steps: int
    busy_s: float = 0.0  # wall time spent in the runner's step() since the stage started
    cached_tokens: int = 0  # prompt positions served from the prefix cache since the stage started
    prefilled_tokens: int = 0  # prompt positions computed by its prefills since the stage started
    replica: int = 0  # which worker of the stage (engine.stats() sums them per stage)
    # Per-request tables held by the worker besides the runner's (queued + running): the next stage's
    # replica of each request in flight, and recently aborted ids (tombstones, expire after a while).
    routes: int = 0
    tombstones: int = 0
    prefixes: int = 0  # conversations whose prefix is cached (thinker)
    kv_slots_used: int = 0  # KV cache slots held: running requests plus cached prefixes
    # thinker: audio-encoder windows encoded since the stage started, and how many windows of requests'
    # audio came encoded ahead (speech encoded while it was spoken)
    audio_windows: int = 0
    audio_windows_ahead: int = 0
    # The worker's process (the server's own for thread workers): pid, resident memory, open fds.
    pid: int = 0
    rss_bytes: int = 0
    open_fds: int = 0
    # (batch size, mean step seconds, steps) per batch size its steps ran (engine/capacity.py)
    step_times: tuple[tuple[int, float, int], ...] = ()
    # the last step also prefilled prompts: its time says nothing of a decode step's (capacity)
    last_step_prefilled: bool = False
    gave_way_s: float = 0.0  # time it waited, its work all AHEAD, for urgent work on its device
    # Where its step time went (engine/step_clock.py): on a CPU, runnable waiting for a CPU; the rest
    # of busy_s the thread was blocked (mostly waiting for the GIL). And the wall time it spent taking
    # incoming messages (`ingested` of them), and its device's utilisation in % (None: not a GPU).
    step_cpu_s: float = 0.0
    step_runnable_s: float = 0.0
    ingest_s: float = 0.0
    ingested: int = 0
    # the worker is a process on a GPU that was started as a client of an MPS daemon (engine/mps.py)
    mps_client: bool = False
    gpu_utilization: float | None = None
    gpu_busy_s: float | None = None  # its device's utilisation integrated over time (step_clock.py)
    graphs_pending: int = 0  # CUDA graphs left for after the start, not captured yet (graph_backlog)

    @property
    def live_requests(self) -> int:
        """Entries of per-request state that must drain to 0 once no request is in flight."""
        return self.queued + self.running + self.routes

    @classmethod
    def total(cls, name: str, parts: list[StageStats]) -> StageStats:
        """One stage's figures summed over its replicas (last_batch_size: the largest; no process)."""
        return cls(
            name,
            queued=sum(p.queued for p in parts),
            running=sum(p.running for p in parts),
            last_batch_size=max((p.last_batch_size for p in parts), default=0),
            steps=sum(p.steps for p in parts),
            busy_s=sum(p.busy_s for p in parts),
            cached_tokens=sum(p.cached_tokens for p in parts),
            prefilled_tokens=sum(p.prefilled_tokens for p in parts),
            routes=sum(p.routes for p in parts),
            tombstones=sum(p.tombstones for p in parts),
            prefixes=sum(p.prefixes for p in parts),
            kv_slots_used=sum(p.kv_slots_used for p in parts),
            gave_way_s=sum(p.gave_way_s for p in parts),
            audio_windows=sum(p.audio_windows for p in parts),
            audio_windows_ahead=sum(p.audio_windows_ahead for p in parts),
            step_cpu_s=sum(p.step_cpu_s for p in parts),
            step_runnable_s=sum(p.step_runnable_s for p in parts),
            ingest_s=sum(p.ingest_s for p in parts),
            ingested=sum(p.ingested for p in parts),
            gpu_utilization=max((g for p in parts if (g := p.gpu_utilization) is not None), default=None),
            gpu_busy_s=max((g for p in parts if (g := p.gpu_busy_s) is not None), default=None),
            graphs_pending=sum(p.graphs_pending for p in parts),
        )


# How long messages take between the engine client and a core process (`stages.core: process`), hop by hop:
# `request`, from the client's `generate` until the core's main thread takes the request; `outbox`, from the
# core's dispatcher handing an output over until the core's outbox thread puts its batch on the channel (the
# oldest output of each batch); `channel`, from a batch being put on the channel (pickling it, the pipe)
# until the server has read and unpickled it; `loop`, from being read until the event loop hands the batch
# to its requests (a reader thread's hand-over; nothing once the loop reads the core itself). Times are
# `time.monotonic()`, which both processes read alike on one host.
HOPS = ("request", "outbox", "channel", "loop")
HOP_BUCKETS = (0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)  # seconds


def count_into(counts: list[int], bounds: tuple[float, ...], value: float) -> None:
    """Count `value` in cumulative histogram `counts` (one per upper bound in `bounds`)."""
    for i, bound in enumerate(bounds):
        if value <= bound:
            counts[i] += 1


@dataclass
class SecondsHistogram:
    """Times in seconds of what `name` says (a hop of HOPS, by default, with HOP_BUCKETS): `counts`
    cumulative per `bounds` bound, how many, their sum."""

    name: str
    bounds: tuple[float, ...] = HOP_BUCKETS
    counts: list[int] = field(default_factory=list)
    total: int = 0
    sum_s: float = 0.0

    def __post_init__(self) -> None:
        if not self.counts:
            self.counts = [0] * len(self.bounds)

    def record(self, seconds: float) -> None:
        seconds = max(0.0, seconds)
        self.total += 1
        self.sum_s += seconds
        count_into(self.counts, self.bounds, seconds)

    def copy(self) -> SecondsHistogram:
        return SecondsHistogram(self.name, self.bounds, list(self.counts), self.total, self.sum_s)


@dataclass(frozen=True)
class Capacity:
    """The audio streams the engine measures it can serve in real time (engine/capacity.py)."""

    streams: int | None  # None: not measured yet, or measured admission is off
    active_streams: int  # requests with audio in the engine now
    worst_slack_s: float | None = None  # least audio ahead of real time among streams already playing
    stalled: bool = False  # a stream's slack is under capacity.min_slack_s: admit no new stream
    stages: tuple[tuple[str, int | None], ...] = ()  # each stage's own figure

    def refusal(self, promised: int) -> str | None:
        """Why one more stream, on top of `promised` admitted ones, cannot be served in real time, or
        None if it can. With none promised one is always admitted: the engine can do no better than
        serve it alone, and only serving measures the stages again."""
        if promised == 0:
            return None
        if self.stalled:
            return (
                f"an admitted stream's audio is running behind real time (slack {self.worst_slack_s:.2f} s); "
                "retry shortly"
            )
        if self.streams is not None and promised + 1 > self.streams:
            return (
                f"the server is at its measured capacity of {self.streams} real-time audio streams; "
                "retry shortly"
            )
        return None


@dataclass(frozen=True)
class EngineStats:
    stages: tuple[StageStats, ...]
    active_requests: int
    conversations: int = 0  # conversations the router keeps a thinker replica for (cache_key affinity)
    routed: int = 0  # requests counted against a replica by the router (sum of replica_load)
    capacity: Capacity | None = None
    hops: tuple[SecondsHistogram, ...] = ()  # a core process's hops (HOPS); none for an in-process engine
    # the requests the engine serves at once when its start found GPU memory for no wider batch
    # (`Engine.narrow`); None: the profile's widths
    narrowed: int | None = None


# The talker's context holds a prompt's user positions plus 9 (the assistant start, tts pads and bos,
# the codec's think/voice/pad/bos ids; runners/talker_prefill.py `prompt_inputs`) and needs 2 more to
# write audio: a prompt of at most talker.max_seq_len - TALKER_PROMPT_EXTRA tokens always leaves it room.
TALKER_PROMPT_EXTRA = 11


def text_exceeds(texts: Sequence[str], max_chars: int | None) -> bool:
    """Whether `texts` hold more than `max_chars` characters once NFC-normalized, as the tokenizer
    reads them: a cheap test, before tokenizing, that they cannot fit a prompt (see
    `ModelInfo.max_prompt_chars`).

    Only text over the limit as sent is normalized (composing can shorten it), so the common case
    costs a sum of lengths. None: no limit is known (a model without a tokenizer).
    """
    if max_chars is None or sum(map(len, texts)) <= max_chars:
        return False
    return sum(len(unicodedata.normalize("NFC", t)) for t in texts) > max_chars


@dataclass(frozen=True)
class ModelInfo:
    """What the engine tells callers about the served model."""

    served_name: str
    sample_rate: int
    voices: tuple[str, ...]
    default_voice: str
    max_prompt_tokens: int
    # Text longer than this (in characters) cannot fit max_prompt_tokens: no vocabulary entry stands for
    # more characters than max_prompt_chars / max_prompt_tokens. None: no tokenizer (token-id prompts).
    max_prompt_chars: int | None = None
    # Log-mel frames the audio encoder attends over at once: speech still being spoken can be encoded
    # ahead in whole windows of this many frames (`EngineAPI.encode_ahead`). 0: not at all.
    audio_window_frames: int = 0
