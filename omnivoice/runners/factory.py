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
from omnivoice.models.dummy import DummySource, build_dummy_model
from omnivoice.models.dummy_tokenizer import load_dummy_processor_parts
from omnivoice.models.loader import ModelSpec, load_model, load_processor_parts
from omnivoice.runners.compile_cache import CompiledArtifacts, artifact_key, use_inductor_cache_under
from omnivoice.runners.start_steps import Report, StartSteps
from omnivoice.types import StageName

log = logging.getLogger(__name__)

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


StageReplica = tuple[StageName, int]


def build_runners(
    profile: Profile, path: Path | DummySource, only: tuple[StageReplica, ...], report: Report | None = None
) -> dict[StageReplica, Any]:
    """Load the checkpoint (or build the dummy model) once and build a runner per (stage, replica),
    one after the other in this thread; each step of the start is reported through `report`."""
    factory = RunnerFactory(profile, path, only, report)
    runners = {(name, replica): factory.build(name, replica, report) for name, replica in only}
    log.info("runners ready: %s", factory.names)
    return runners


class RunnerFactory:
    """The loaded checkpoint (or dummy model) of the stages one worker host serves, and their runners.

    Replicas on one device share that device's copy of the weights (thread workers); a replica on
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
        first_cfg = stages.stage(only[0][0])
        first_device = first_cfg.replica_device(only[0][1])
        self.names = ", ".join(f"{s}#{r}" for s, r in only)
        self.artifacts = _kept_artifacts(profile, path, only)
        log.info("loading %s for %s (%s, %s)", path, self.names, first_device, first_cfg.dtype)
        steps = StartSteps(*(only[0] if len(only) == 1 else ("engine", 0)), report)
        with steps.step("load weights"):
            if isinstance(path, DummySource):  # random weights, built where the first stage runs
                self.model, self.spec = build_dummy_model(path, first_device, _DTYPES[first_cfg.dtype])
            else:
                loaded = load_model(path, device="cpu", dtype=_DTYPES[first_cfg.dtype])
                self.model, self.spec = loaded.model, loaded.spec
        if any(stages.stage(s).replica_device(r).startswith("cuda") for s, r in only):
            _grouped_experts(self.model)
        # the thinker compiles grammars against the served tokenizer
        self.tokenizer = _tokenizer(profile, path) if any(s == "thinker" for s, _ in only) else None
        self._placed: dict[tuple[str, str], Any] = {}  # (part, device) -> module on that device

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
        log.info("%s runner (replica %d) built in %.1f s", name, replica, time.perf_counter() - began)
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
        special = torch.tensor([self.spec.tts_bos_id, self.spec.tts_eos_id, self.spec.tts_pad_id])
        embed = self.model.thinker.get_input_embeddings()
        return embed(special.to(embed.weight.device)).detach()

    def _part(self, attr: str, device: torch.device, dtype: torch.dtype) -> Any:
        key = (attr, str(device))
        if key not in self._placed:
            module = getattr(self.model, attr)
            # the first placement moves the loaded module; further devices get copies
            moved = any(k[0] == attr for k in self._placed)
            self._placed[key] = (copy.deepcopy(module) if moved else module).to(device, dtype)
        return self._placed[key]


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
    use_inductor_cache_under(root)
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
    text = getattr(getattr(model, "config", None), "thinker_config", None)
    chosen = getattr(getattr(text, "text_config", None), "_experts_implementation", "?")
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
