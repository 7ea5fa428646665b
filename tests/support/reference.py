"""Reference output: transformers' own greedy `generate()` on a `Prompt`, for the engine's parity tests
(tests/engine/test_engine.py; tests/models/test_reference.py checks the reference itself).

Greedy runs are bit-identical across runs and processes, so whatever the engine does (batching,
streaming, its own KV cache) must reproduce these text ids, codec codes and samples token for token.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import torch
from transformers import Qwen3OmniMoeForConditionalGeneration

from omnivoice.models.loader import ModelSpec
from omnivoice.models.prompt import audio_inputs
from omnivoice.types import Prompt


def reference_generate(
    model: Qwen3OmniMoeForConditionalGeneration,
    spec: ModelSpec,
    prompt: Prompt,
    voice: str,
    thinker_tokens: int,
    talker_tokens: int,
    talker_repetition_penalty: float = 1.05,
    *,
    thinker_min_tokens: int | None = None,
    talker_min_tokens: int | None = None,
) -> tuple[list[int], torch.Tensor, np.ndarray]:
    """Run `model.generate()` greedily on `prompt` and return (text_ids, codes, wav).

    - text_ids: the thinker's new tokens (ending with its stop token if it produced one).
    - codes: [num_code_groups, frames] int64, the codec frames the talker produced. transformers
      keeps them internal, so a forward hook on the talker collects the `residual_codes` each decode
      step reports (exactly the tensors generate() stacks); a talker that runs M steps yields M - 1
      frames, since the last sampled token never gets its residual codebooks.
    - wav: float32 mono PCM at `spec.output_sample_rate`, as generate() returns it.

    `thinker_tokens` / `talker_tokens` are the max new tokens; the min defaults to the same value
    so random-weight checkpoints produce fixed lengths (pass 0 to let stop tokens end generation).
    The talker's repetition penalty only sees the codec tokens it generated (generate() feeds it
    embeddings, not ids), so the engine must apply it over generated codebook-0 tokens only.
    Audio goes in as Qwen3OmniMoeProcessor would pass it: input_features [num_audios, n_mels, T]
    plus feature_attention_mask [num_audios, T].
    """
    spec.speaker_id(voice)  # a clear ValueError for unknown voices, before any work
    if thinker_tokens < 1 or talker_tokens < 2:
        raise ValueError("need thinker_tokens >= 1 and talker_tokens >= 2 (one codec frame)")
    input_ids = torch.tensor([prompt.input_ids], dtype=torch.long, device=model.device)
    inputs: dict[str, Any] = {"input_ids": input_ids, "attention_mask": torch.ones_like(input_ids)}
    audio = audio_inputs(prompt)
    if audio is not None:
        features, mask = audio
        inputs["input_features"] = features.to(model.device, model.dtype)
        inputs["feature_attention_mask"] = mask.to(model.device)  # generate() also derives audio lengths
    if prompt.image_patches:  # as the image processor hands them over: all patches, one grid per image
        inputs["pixel_values"] = torch.from_numpy(np.concatenate(prompt.image_patches)).to(model.device)
        inputs["image_grid_thw"] = torch.tensor(prompt.image_grids, dtype=torch.long, device=model.device)
    codes: list[torch.Tensor] = []

    def collect(_module: torch.nn.Module, _args: object, output: Any) -> None:  # the talker's ModelOutput
        residual_codes = output.hidden_states[1]  # [batch, num_code_groups], None on the prefill step
        if residual_codes is not None:
            codes.append(residual_codes[0].detach().cpu())

    hook = model.talker.register_forward_hook(collect)
    try:
        with warnings.catch_warnings():
            # The generated-tokens-only repetition penalty described above is intended: silence its warning.
            warnings.filterwarnings("ignore", message="Passing `repetition_penalty` with `inputs_embeds`")
            sequences, wav = model.generate(
                **inputs,
                speaker=voice,
                return_audio=True,
                thinker_max_new_tokens=thinker_tokens,
                thinker_min_new_tokens=thinker_tokens if thinker_min_tokens is None else thinker_min_tokens,
                thinker_eos_token_id=list(spec.thinker_eos_ids),
                thinker_do_sample=False,
                thinker_repetition_penalty=1.0,
                talker_max_new_tokens=talker_tokens,
                talker_min_new_tokens=talker_tokens if talker_min_tokens is None else talker_min_tokens,
                talker_do_sample=False,
                talker_temperature=1.0,  # unused when greedy; the 0.9 default would only raise a warning
                talker_repetition_penalty=talker_repetition_penalty,
            )
    finally:
        hook.remove()
    text_ids = sequences[0, input_ids.shape[1] :].tolist()
    frames = torch.stack(codes, dim=1) if codes else torch.zeros(spec.num_code_groups, 0, dtype=torch.long)
    return text_ids, frames, wav.reshape(-1).float().cpu().numpy()
