"""Build the runners of the stages a worker hosts, from a profile and a checkpoint folder."""

from __future__ import annotations

import copy
import logging
import time
from pathlib import Path
from typing import Any

import torch

from omnivoice.config import Profile
from omnivoice.models.build_cache import default_cache_dir
from omnivoice.models.dummy import DummySource, build_dummy_part, dummy_spec, dummy_tts_embeds
from omnivoice.models.dummy_tokenizer import load_dummy_processor_parts
from omnivoice.models.loader import ModelSpec, load_processor_parts
from omnivoice.models.parts import load_part, load_tts_embeds
from omnivoice.runners.compile_cache import CompiledArtifacts, artifact_key, use_compile_caches_under
from omnivoice.runners.gpu_memory import memory_note
from omnivoice.runners.start_steps import Report, StartSteps
from omnivoice.types import StageName

log = logging.getLogger(__name__)

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


StageReplica = tuple[StageName, int]


def build_runners(
    profile: Profile, path: Path | DummySource, only: tuple[StageReplica, ...], report: Report | None = None
) -> dict[StageReplica, Any]:
    """Load the parts of the checkpoint (or build those of the dummy model) that the stages in `only`
    use, once, and build a runner per (stage, replica), one after the other in this thread; each step
    of the start is reported through `report`."""
    factory = RunnerFactory(profile, path, only, report)
    runners = {(name, replica): factory.build(name, replica, report) for name, replica in only}
    log.info("runners ready: %s", factory.names)
    return runners


class RunnerFactory:
    """The model parts of the stages one worker host serves, and their runners.

    Only the parts of the hosted stages are loaded (or, for a dummy model, built), each onto the
    device of its stage's first hosted replica: a stage process holds its own stage's weights and no
    other's. Replicas on one device share that device's copy of a part (thread workers); a replica on
    another device gets its own copy. Each stage thread calls `build` for its own runner, one stage
    after the other (engine/stage_thread.py): a runner's CUDA graphs are then captured by the thread that
    replays them (its own cuBLAS handle, so its own workspaces).

    What torch.compile makes for these stages is kept after each build and loaded before the first
    (runners/compile_cache.py), so a second start reuses it.
    """

    def __init__(
        self,
        profile: Profile,
        path: Path | DummySource,
        only: tuple[StageReplica, ...],
        report: Report | None = None,
    ) -> None:
        self.stages = stages = profile.stages
        torch.set_num_threads(max(stages.stage(s).threads for s, _ in only))
        self.names = ", ".join(f"{s}#{r}" for s, r in only)
        self.spec = dummy_spec(path) if isinstance(path, DummySource) else ModelSpec.from_pretrained(path)
        self.artifacts = _kept_artifacts(profile, path, only)
        self._placed: dict[tuple[str, str], Any] = {}  # (part, device) -> module on that device
        first: dict[StageName, int] = {}
        for s, r in only:
            first.setdefault(s, r)
        steps = StartSteps(*(only[0] if len(only) == 1 else ("engine", 0)), report)
        for s, r in first.items():
            cfg = stages.stage(s)
            device = torch.device(cfg.replica_device(r))
            log.info(
                "loading the %s of %s for %s (%s, %s)%s",
                s,
                path,
                self.names,
                device,
                cfg.dtype,
                memory_note(device),
            )
            with steps.step("load weights" if len(first) == 1 else f"load {s} weights"):
                part = _load_part(path, s, device, _DTYPES[cfg.dtype])
            if s != "code2wav" and any(cfg.replica_device(i).startswith("cuda") for x, i in only if x == s):
                _grouped_experts(part)
            self._placed[(s, str(device))] = part
        self._tts: torch.Tensor | None = None
        if "talker" in first:
            cfg = stages.stage("talker")
            device = torch.device(cfg.replica_device(first["talker"]))
            self._tts = _tts_embeds(path, self.spec, device, _DTYPES[cfg.dtype])
        # the thinker compiles grammars against the served tokenizer
        self.tokenizer = _tokenizer(profile, path) if "thinker" in first else None

    def build(self, name: StageName, replica: int, report: Report | None = None) -> Any:
        """The runner of `name` replica `replica` (its CUDA graphs captured, its kernels compiled), its
        start's steps reported through `report`."""
        cfg = self.stages.stage(name)
        device = torch.device(cfg.replica_device(replica))
        dtype = _DTYPES[cfg.dtype]

        def part(attr: str) -> Any:
            return self._part(attr, device, dtype)

        began = time.perf_counter()
        steps = StartSteps(name, replica, report)
        runner = _runner(
            name, cfg, part, self._tts_embeds, self.spec, self.stages, device, self.tokenizer, steps
        )
        took = time.perf_counter() - began
        log.info(
            "%s runner (replica %d) built in %.1f s%s", name, replica, took, memory_note(device, held=True)
        )
        if self.artifacts is not None:
            try:
                self.artifacts.save()
            except Exception:  # a cache that cannot be written costs the next start time, not this one
                log.warning(
                    "could not keep the compiled artifacts in %s", self.artifacts.folder, exc_info=True
                )
        return runner

    def _tts_embeds(self) -> torch.Tensor:
        """The thinker's embeddings of the TTS bos, eos and pad tokens [3, H], which the talker's prompts
        use."""
        if self._tts is None:
            raise RuntimeError("the talker's TTS embeddings were not loaded: no talker is hosted here")
        return self._tts

    def _part(self, attr: str, device: torch.device, dtype: torch.dtype) -> Any:
        key = (attr, str(device))
        if key not in self._placed:  # a replica on another device: a copy of the loaded part
            loaded = next(m for (a, _), m in self._placed.items() if a == attr)
            self._placed[key] = copy.deepcopy(loaded).to(device, dtype)
        return self._placed[key]


def _load_part(path: Path | DummySource, part: StageName, device: torch.device, dtype: torch.dtype) -> Any:
    if isinstance(path, DummySource):  # random weights, built on the device
        return build_dummy_part(path, part, device, dtype)
    return load_part(path, part, device, dtype)


def _tts_embeds(
    path: Path | DummySource, spec: ModelSpec, device: torch.device, dtype: torch.dtype
) -> torch.Tensor:
    if isinstance(path, DummySource):
        return dummy_tts_embeds(path, device, dtype)
    return load_tts_embeds(path, spec, device, dtype)


def _kept_artifacts(
    profile: Profile, path: Path | DummySource, only: tuple[StageReplica, ...]
) -> CompiledArtifacts | None:
    """The compiled artifacts kept for these stages, loaded into torch's caches; None when none of
    them compiles (compile off, or not on a GPU)."""
    stages = profile.stages
    compiling = [
        torch.device(stages.stage(s).replica_device(r))
        for s, r in only
        if stages.stage(s).compile and stages.stage(s).replica_device(r).startswith("cuda")
    ]
    if not compiling:
        return None
    cache = Path(profile.model.cache_dir).expanduser() if profile.model.cache_dir else default_cache_dir()
    root = cache / "compiled"
    use_compile_caches_under(root)
    settings = {f"{s}{r}": stages.stage(s).model_dump(mode="json") for s, r in only}
    label = "-".join(f"{s}{r}" for s, r in only)
    artifacts = CompiledArtifacts(root, artifact_key(label, str(path), settings, compiling[0]))
    artifacts.load()
    return artifacts


def _grouped_experts(model: Any) -> None:
    """MoE experts as grouped GEMMs on GPUs: a few kernels per layer and no host sync (so decode steps
    can be captured as CUDA graphs), instead of a loop over the experts a batch hits."""
    setter = getattr(model, "set_experts_implementation", None)
    if setter is None:
        log.warning("this transformers has no set_experts_implementation: MoE experts run as it chooses")
        return
    setter("grouped_mm")
    text = getattr(getattr(model, "config", None), "text_config", None)
    chosen = getattr(text, "_experts_implementation", "?")
    log.info("MoE experts: %s", chosen)


def _tokenizer(profile: Profile, path: Path | DummySource) -> Any:
    """The served model's tokenizer (a dummy model's is built from code)."""
    if isinstance(path, DummySource):
        return load_dummy_processor_parts(profile.model.cache_dir)[0]
    return load_processor_parts(path)[0]


def _runner(
    name: str,
    cfg: Any,
    part: Any,
    tts_embeds: Any,
    spec: ModelSpec,
    stages: Any,
    device: torch.device,
    tokenizer: Any,
    steps: StartSteps,
) -> Any:
    from omnivoice.runners.code2wav import Code2WavRunner
    from omnivoice.runners.talker import TalkerRunner
    from omnivoice.runners.thinker import ThinkerRunner

    if name == "thinker":
        return ThinkerRunner(part("thinker"), spec, cfg, device, tokenizer, stages.priority, start=steps)
    if name == "talker":
        return TalkerRunner(part("talker"), tts_embeds(), spec, cfg, device, stages.priority, start=steps)
    chunk = stages.code2wav.chunk
    frame_s = 1.0 / spec.frame_rate
    return Code2WavRunner(
        part("code2wav"), cfg, chunk, device, priority=stages.priority, frame_s=frame_s, start=steps
    )
