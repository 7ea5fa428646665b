"""The transformers baseline: `Qwen3OmniMoeForConditionalGeneration.generate()` one request at a time.

Same model source, prompts, sampling defaults and fixed lengths as the engine benchmark. generate() is
not streaming: text and the whole audio arrive when it returns, so TTFT = TTFP = its latency.
The model is built (or loaded) on the thinker stage's device and freed again before the engine starts:
two copies of the 30B model do not fit one GPU.
"""

from __future__ import annotations

import gc
import logging
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from omnivoice.bench.engine_load import EngineLoadConfig, EngineLoadResult, make_requests
from omnivoice.bench.metrics import RequestRecord
from omnivoice.config import Profile
from omnivoice.models.dummy import DummySource, build_dummy_model
from omnivoice.models.loader import ModelSpec, load_model
from omnivoice.runners.talker import codec_token_sampling
from omnivoice.types import GenerationRequest, Sampling

log = logging.getLogger(__name__)

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _stage_kwargs(prefix: str, s: Sampling) -> dict[str, Any]:
    kw: dict[str, Any] = {
        f"{prefix}_max_new_tokens": s.max_tokens,
        f"{prefix}_min_new_tokens": s.min_tokens,
        f"{prefix}_repetition_penalty": s.repetition_penalty,
        f"{prefix}_do_sample": s.temperature > 0,
    }
    if s.temperature > 0:
        kw.update(
            {f"{prefix}_temperature": s.temperature, f"{prefix}_top_p": s.top_p, f"{prefix}_top_k": s.top_k}
        )
    return kw


def generate_once(model: Any, spec: ModelSpec, req: GenerationRequest) -> RequestRecord:
    """One generate() call, timed from the call to the audio being on the host."""
    ids = torch.tensor([req.prompt.input_ids], device=model.device)
    if req.thinker.seed is not None:
        torch.manual_seed(req.thinker.seed)
    record = RequestRecord(t0=time.perf_counter())
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Passing `repetition_penalty` with `inputs_embeds`")
        sequences, wav = model.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            speaker=req.voice,
            return_audio=True,
            thinker_eos_token_id=list(spec.thinker_eos_ids),
            **_stage_kwargs("thinker", req.thinker),
            # generate() counts the talker's codebook-0 tokens, one more than the request's frames
            **_stage_kwargs("talker", codec_token_sampling(req.talker)),
        )
    samples = wav.reshape(-1).float().cpu().numel()  # waits for the GPU
    end = time.perf_counter()
    record.first_text = record.end = end
    record.audio_chunks.append((end, samples / spec.output_sample_rate))
    record.text_tokens = sequences.shape[1] - ids.shape[1]
    return record


def run_transformers_baseline(
    profile: Profile,
    source: Path | DummySource,
    cfg: EngineLoadConfig,
    newline_id: int,
    progress: Callable[[str, int, int, RequestRecord], None] | None = None,
) -> EngineLoadResult:
    """`cfg.num_prompts` generate() calls at batch 1 after `cfg.warmups` short ones; frees the model after."""
    stage = profile.stages.thinker
    dtype = _DTYPES[stage.dtype]
    torch.set_num_threads(stage.threads)  # as the engine's workers run (matters on CPU only)
    started = time.perf_counter()
    if isinstance(source, DummySource):
        model, spec = build_dummy_model(source, stage.device, dtype)
    else:
        loaded = load_model(source, device=stage.device, dtype=dtype)
        model, spec = loaded.model, loaded.spec
        del loaded  # `model` must be the last reference, so the finally below frees it
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    log.info("transformers model ready in %.1f s", time.perf_counter() - started)
    try:
        warm_cfg = EngineLoadConfig(cfg.warmups, 1, 0, cfg.prompt_tokens, 4, 3, cfg.voice, cfg.seed + 1)
        for i, req in enumerate(make_requests(profile, spec, warm_cfg, newline_id, cfg.warmups, "warm")):
            record = generate_once(model, spec, req)
            if progress is not None:
                progress("baseline warm-up", i + 1, cfg.warmups, record)
        records = []
        start = time.perf_counter()
        for i, req in enumerate(make_requests(profile, spec, cfg, newline_id, cfg.num_prompts, "hf")):
            records.append(generate_once(model, spec, req))
            if progress is not None:
                progress("baseline", i + 1, cfg.num_prompts, records[-1])
        return EngineLoadResult(records, time.perf_counter() - start)
    finally:
        del model
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
            log.info("baseline model freed: %.1f GB still allocated", torch.cuda.memory_allocated() / 1e9)
