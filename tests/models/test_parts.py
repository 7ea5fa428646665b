"""Each stage part of a checkpoint loads on its own with the weights the whole model holds, and the
talker's TTS embeddings are the thinker's rows."""

from __future__ import annotations

from pathlib import Path

import torch

from omnivoice.models.loader import load_model
from omnivoice.models.parts import PART_CLASSES, load_part, load_tts_embeds


def test_each_part_loads_alone_with_the_whole_models_weights(tiny_checkpoint: Path) -> None:
    whole = load_model(tiny_checkpoint)
    for name in PART_CLASSES:
        part = load_part(tiny_checkpoint, name, torch.device("cpu"), torch.float32)
        ref = getattr(whole.model, name).state_dict()
        got = part.state_dict()
        assert set(got) == set(ref), name
        assert all(torch.equal(got[k], ref[k]) for k in ref), name  # the talker's fused experts included
        assert not part.training and not any(p.requires_grad for p in part.parameters())
    spec = whole.spec
    tts = load_tts_embeds(tiny_checkpoint, spec, torch.device("cpu"), torch.float32)
    table = whole.model.thinker.get_input_embeddings().weight
    assert torch.equal(tts, table[[spec.tts_bos_id, spec.tts_eos_id, spec.tts_pad_id]])


def test_a_stage_worker_loads_only_its_own_part(tiny_checkpoint: Path) -> None:
    from omnivoice.runners.factory import RunnerFactory
    from tests.support.engine import profile_for

    whole = load_model(tiny_checkpoint)
    factory = RunnerFactory(profile_for(tiny_checkpoint, worker="process"), tiny_checkpoint, (("talker", 0),))
    assert [part for part, _ in factory._placed] == ["talker"]
    assert factory.tokenizer is None  # the thinker's, for its grammars
    spec = whole.spec
    table = whole.model.thinker.get_input_embeddings().weight
    assert torch.equal(factory._tts_embeds(), table[[spec.tts_bos_id, spec.tts_eos_id, spec.tts_pad_id]])
