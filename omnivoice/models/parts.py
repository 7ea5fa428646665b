"""The stage parts of a Qwen3-Omni checkpoint, each loaded on its own: a stage worker holds only its
stage's weights.

A stage process serves one part (the thinker, the talker or Code2Wav); loading the whole model in each
of three processes on one GPU would hold three copies of it. Each part is loaded with its own
transformers class from the whole checkpoint (the other parts' tensors are skipped, never read into
memory), straight onto its device. The talker's prompts also use the thinker's embeddings of the TTS
bos, eos and pad tokens: those three rows are read from the checkpoint alone.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from transformers import Qwen3OmniMoeConfig
from transformers.conversion_mapping import (
    get_checkpoint_conversion_mapping,
    register_checkpoint_conversion_mapping,
)
from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import (
    Qwen3OmniMoeCode2Wav,
    Qwen3OmniMoeTalkerForConditionalGeneration,
    Qwen3OmniMoeThinkerForConditionalGeneration,
)

from omnivoice.models.loader import ModelSpec

log = logging.getLogger(__name__)

PART_CLASSES: dict[str, Any] = {
    "thinker": Qwen3OmniMoeThinkerForConditionalGeneration,
    "talker": Qwen3OmniMoeTalkerForConditionalGeneration,
    "code2wav": Qwen3OmniMoeCode2Wav,
}
TTS_EMBED_KEY = "thinker.model.embed_tokens.weight"


def load_part(path: Path, part: str, device: torch.device, dtype: torch.dtype) -> Any:
    """Load one part of the checkpoint at `path` onto `device` in `dtype` (eval mode, no grads);
    raises if the checkpoint lacks any of its weights."""
    cls = PART_CLASSES[part]
    config = getattr(Qwen3OmniMoeConfig.from_pretrained(path, local_files_only=True), f"{part}_config")
    _convert_like_the_whole_model(cls)
    placement: dict[str, Any] = {} if device.type == "cpu" else {"device_map": str(device)}
    with _without_load_report():
        model, info = cls.from_pretrained(
            path, config=config, dtype=dtype, local_files_only=True, output_loading_info=True,
            key_mapping={rf"^{part}\.": ""}, **placement,
        )  # fmt: skip
    if info["missing_keys"] or info["mismatched_keys"]:
        missing = sorted(info["missing_keys"]) + [str(k) for k in info["mismatched_keys"]]
        raise ValueError(f"{path}: the {part}'s weights are incomplete: {missing[:8]}")
    model.eval().requires_grad_(False)
    return model


def load_tts_embeds(path: Path, spec: ModelSpec, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """The thinker's input embeddings of the TTS bos, eos and pad tokens [3, H], read from the
    checkpoint's shards (three rows, not the table)."""
    shard = _shard_of(path, TTS_EMBED_KEY)
    rows = []
    with safe_open(str(shard), framework="pt") as f:
        table = f.get_slice(TTS_EMBED_KEY)
        for token in (spec.tts_bos_id, spec.tts_eos_id, spec.tts_pad_id):
            rows.append(table[token : token + 1])
    return torch.cat(rows).to(device, dtype)  # [3, H]


def _shard_of(path: Path, key: str) -> Path:
    index = path / "model.safetensors.index.json"
    if index.is_file():
        return path / json.loads(index.read_text())["weight_map"][key]
    return path / "model.safetensors"


def _convert_like_the_whole_model(cls: Any) -> None:
    """Checkpoints keep each MoE expert's weights apart; transformers fuses them into the grouped
    tensors its model holds by a conversion it registers for the whole model and the thinker. The
    talker loaded on its own needs the same conversion: register it under the part's class name."""
    name = cls.__name__
    if get_checkpoint_conversion_mapping(name) is None:
        mapping = get_checkpoint_conversion_mapping("qwen3_omni_moe")
        if mapping is not None:
            register_checkpoint_conversion_mapping(name, mapping)


class _DropLoadReport(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return "LOAD REPORT" not in record.getMessage()


@contextmanager
def _without_load_report() -> Iterator[None]:
    """transformers logs every checkpoint tensor that the part does not hold (the other parts' ones)
    as a warning; what the part lacks is checked from the loading info instead."""
    logger = logging.getLogger("transformers.modeling_utils")
    drop = _DropLoadReport()
    logger.addFilter(drop)
    try:
        yield
    finally:
        logger.removeFilter(drop)
