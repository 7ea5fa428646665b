"""Build the runners of the stages a worker hosts, from a profile and a checkpoint folder."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch

from omnivoice.config import Profile
from omnivoice.engine.chunks import StageName
from omnivoice.models.dummy import DummySource, build_dummy_model
from omnivoice.models.loader import ModelSpec, load_model

log = logging.getLogger(__name__)

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def build_runners(profile: Profile, path: Path | DummySource, only: tuple[StageName, ...]) -> dict[str, Any]:
    """Load the checkpoint (or build the dummy model) once and build the runners named in `only`."""
    from omnivoice.runners.code2wav import Code2WavRunner
    from omnivoice.runners.talker import TalkerRunner
    from omnivoice.runners.thinker import ThinkerRunner

    stages = profile.stages
    threads = max(stages.stage(s).threads for s in only)
    torch.set_num_threads(threads)
    first = stages.stage(only[0])
    log.info("loading %s for %s (%s, %s)", path, ", ".join(only), first.device, first.dtype)
    spec: ModelSpec
    if isinstance(path, DummySource):  # random weights, built where the first stage runs
        model, spec = build_dummy_model(path, first.device, _DTYPES[first.dtype])
    else:
        loaded = load_model(path, device="cpu", dtype=_DTYPES[first.dtype])
        model, spec = loaded.model, loaded.spec
    runners: dict[str, Any] = {}
    for name in only:
        cfg = stages.stage(name)
        device = torch.device(cfg.device)
        dtype = _DTYPES[cfg.dtype]
        if name == "thinker":
            runners[name] = ThinkerRunner(model.thinker.to(device, dtype), spec, cfg, device)
        elif name == "talker":
            special = torch.tensor([spec.tts_bos_id, spec.tts_eos_id, spec.tts_pad_id])
            tts = model.thinker.get_input_embeddings()(special.to(model.thinker.device)).detach()
            runners[name] = TalkerRunner(model.talker.to(device, dtype), tts, spec, cfg, device)
        else:
            runners[name] = Code2WavRunner(
                model.code2wav.to(device, dtype), cfg, stages.code2wav.chunk, device
            )
    log.info("runners ready: %s", ", ".join(only))
    return runners
