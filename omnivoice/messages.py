"""Typed messages that travel between the engine and its stage workers, and between the engine
client in the server and an engine core in a process of its own.

Arrays are numpy (or torch on the same device when the stages share a process); they cross process
boundaries through a connector's shared memory.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from omnivoice.types import EngineStats, GenerationRequest, SecondsHistogram, StageName, StageStats


@dataclass(frozen=True)
class NewRequest:
    """Engine -> thinker: start a request; from the engine client to a core, `sent_at` is when it was
    sent (time.monotonic(), for the `request` hop of types.HOPS)."""

    request: GenerationRequest
    sent_at: float = 0.0


@dataclass(frozen=True)
class Abort:
    """Engine -> every stage: drop the request and free what it holds."""

    request_id: str


@dataclass(frozen=True)
class AudioStarted:
    """Engine -> thinker and talker: the request's first audio has left Code2Wav, so its playback
    started; from now on the stage measures how far its output runs ahead (runners/priority.py)."""

    request_id: str


@dataclass(frozen=True)
class ForgetPrefix:
    """Engine -> thinker: a conversation ended; free its cached prefix."""

    cache_key: str


@dataclass(frozen=True)
class EncodeAhead:
    """Engine -> thinker: whole audio-encoder windows of speech still being spoken in a conversation,
    to encode before the turn's request comes (which then encodes only the rest)."""

    cache_key: str
    features: tuple[Any, ...]  # each np.ndarray [n_mels, window frames] float32


@dataclass(frozen=True)
class Shutdown:
    """Engine -> stage: finish the loop."""


@dataclass(frozen=True)
class TimeSteps:
    """Engine -> stage: whether the worker times its steps for the capacity (engine/capacity.py). Off
    while the warm-up burst runs: its steps pay first-time costs and share the device with the graphs
    still being captured, and a kept calibration's figures must not be replaced by them."""

    enabled: bool


@dataclass(frozen=True)
class ThinkerChunk:
    """Thinker -> talker: what the talker consumes, streamed as the thinker generates.

    The first chunk of a request carries the prompt (ids, layer-0 embeddings and the hidden state of
    the talker's accept layer) and the request's talker settings. Every chunk carries the newly
    generated tokens and their layer-0 embeddings. `finished` marks the last chunk; the final
    generated token is never forwarded (transformers' generate() never feeds it through the thinker).
    """

    request_id: str
    token_ids: tuple[int, ...]
    token_embeds: Any  # [n, H_thinker]
    finished: bool
    prompt_ids: tuple[int, ...] | None = None
    prompt_embeds: Any = None  # [T, H_thinker]
    prompt_hidden: Any = None  # [T, H_thinker]
    request: GenerationRequest | None = None


@dataclass(frozen=True)
class CodecChunk:
    """Talker -> code2wav: new codec frames of a request, `finished` on the last one. `made_at`: when
    the talker read them back; `accepted_at` (on the first): when the talker took the request
    (monotonic seconds: comparable between the stages of one machine)."""

    request_id: str
    frames: Any  # int64 [num_code_groups, n]
    finished: bool
    first: bool = False
    made_at: float = 0.0
    accepted_at: float = 0.0


@dataclass(frozen=True)
class FirstAudioTimes:
    """When a request's way to its first audio passed each stage (monotonic seconds): the talker took
    it, made the frames of its first chunk, and Code2Wav began and ended that chunk's decode."""

    talker_accepted_at: float
    frames_made_at: float
    decode_started_at: float
    decoded_at: float


@dataclass(frozen=True)
class TokenOutput:
    """Thinker -> engine: newly sampled text tokens."""

    request_id: str
    token_ids: tuple[int, ...]


@dataclass(frozen=True)
class PcmOutput:
    """Code2wav -> engine: a gap-free piece of the response audio (float32 mono)."""

    request_id: str
    index: int
    pcm: Any  # np.ndarray [samples]
    first_audio: FirstAudioTimes | None = None  # on the first piece


@dataclass(frozen=True)
class StageFinished:
    """Stage -> engine: the stage is done with a request (reason stop | length | abort | error)."""

    request_id: str
    stage: StageName
    reason: str
    count: int = 0  # tokens (thinker), frames (talker, code2wav)
    prompt_tokens: int = 0
    error: str | None = None
    cached_tokens: int = 0  # of prompt_tokens, those taken from the conversation's cached prefix (thinker)
    out_of_memory: bool = False  # reason "error": the step ran out of GPU memory (the stage goes on)


@dataclass(frozen=True)
class StartStep:
    """Stage worker -> engine: a step of its start (loading, compiling, capturing graphs) began
    (`seconds` None) or ended after `seconds` (runners/start_steps.py, engine/start_progress.py)."""

    stage: str  # thinker, talker, code2wav, or engine for the engine's own steps
    replica: int
    step: str
    seconds: float | None = None

    @property
    def name(self) -> str:
        """`stage#replica step`: the step's name in the log, `/health` and the kept start times."""
        return f"{self.stage}#{self.replica} {self.step}"


StageInput = (
    NewRequest
    | ThinkerChunk
    | CodecChunk
    | AudioStarted
    | Abort
    | ForgetPrefix
    | EncodeAhead
    | Shutdown
    | TimeSteps
)
EngineMessage = TokenOutput | PcmOutput | StageFinished


# The engine core in a process of its own (engine/core/) and the engine client in the server: the
# client sends NewRequest, Abort, EncodeAhead and ForgetPrefix as the in-process engine would send them
# to its stages, and the core answers with these.


@dataclass(frozen=True)
class HoldRestarts:
    """Engine client -> core: the server drains; restart no stage from now on."""


@dataclass(frozen=True)
class CloseCore:
    """Engine client -> core: stop every stage and end the process."""


@dataclass(frozen=True)
class CoreOutputs:
    """Core -> engine client: outputs of its requests, in the order the core made them (`Finished`
    last for each), and the engine's failure and restart state as they were when they were sent, so
    the client knows why a request failed before its caller asks."""

    outputs: tuple[Any, ...]  # EngineOutput, each naming its request
    failure: str | None
    restarting: bool
    made_at: float = 0.0  # when the oldest of them reached the outbox (time.monotonic())
    sent_at: float = 0.0  # when they were put on the channel


@dataclass(frozen=True)
class CoreRefused:
    """Core -> engine client: a NewRequest was refused before it started."""

    request_id: str
    kind: Literal["overloaded", "unavailable", "invalid", "closed"]
    message: str


@dataclass(frozen=True)
class CoreSnapshot:
    """Core -> engine client, several times a second: what operators and admission read of the
    engine, so that the server never waits on the core for it."""

    stats: EngineStats  # per stage, summed over replicas, with the capacity
    replicas: tuple[StageStats, ...]  # each stage worker's own
    failure: str | None
    restarting: bool
    requests: SecondsHistogram | None = None  # the `request` hop, as the core timed it


@dataclass(frozen=True)
class CoreExpect:
    """Core -> engine client: what the last start with these settings took (engine/start_progress.py)."""

    times: dict[str, float]
    total_s: float


@dataclass(frozen=True)
class CoreReady:
    """Core -> engine client: the stages are up (warmed and calibrated); requests may come."""

    pid: int


@dataclass(frozen=True)
class CoreStartFailed:
    """Core -> engine client: the engine could not start; the process ends."""

    error: str


ToCore = NewRequest | Abort | EncodeAhead | ForgetPrefix | HoldRestarts | CloseCore
FromCore = CoreOutputs | CoreRefused | CoreSnapshot | StartStep | CoreExpect | CoreReady | CoreStartFailed
