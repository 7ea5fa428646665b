"""The thinker's audio encoder work: a bounded number of windows per step (decoding goes on while a
long utterance is encoded), and windows sent ahead while a caller speaks used by the turn's request."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from omnivoice.config import parse_profile
from omnivoice.messages import EncodeAhead, NewRequest, StageFinished, TokenOutput
from omnivoice.runners.factory import build_runners
from omnivoice.types import GenerationRequest, Prompt, Sampling

WINDOW = 800  # log-mel frames of one encoder window (n_window_infer)


@pytest.fixture(scope="module")
def thinker(tiny_checkpoint: Path):
    stage = {"device": "cpu", "worker": "thread", "max_batch": 4, "max_seq_len": 512}
    profile = parse_profile(
        {
            "model": {"path": str(tiny_checkpoint)},
            "stages": {"thinker": {**stage, "audio_windows_per_step": 1}},
        }
    )
    runner = build_runners(profile, tiny_checkpoint, only=(("thinker", 0),))[("thinker", 0)]
    torch.set_num_threads(1)
    return runner


def features(frames: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((128, frames)).astype(np.float32)


def request(thinker: Any, rid: str, mel: np.ndarray | None, tokens: int, key: str | None = None):
    spec = thinker.spec
    audio = (
        ()
        if mel is None
        else (
            spec.audio_start_id,
            *[spec.audio_pad_id] * spec.audio_token_count(mel.shape[1]),
            spec.audio_end_id,
        )
    )
    ids = (
        spec.im_start_id,
        spec.user_id,
        10,
        *audio,
        11,
        spec.im_end_id,
        spec.im_start_id,
        spec.assistant_id,
    )
    prompt = Prompt(ids, () if mel is None else (mel,))
    sampling = Sampling(max_tokens=tokens, min_tokens=tokens)
    return GenerationRequest(rid, prompt, want_audio=False, thinker=sampling, cache_key=key)


def run(thinker: Any, *requests: GenerationRequest) -> dict[str, list[int]]:
    """Every request to its end; each one's tokens."""
    for r in requests:
        thinker.accept(NewRequest(r))
    tokens: dict[str, list[int]] = {r.request_id: [] for r in requests}
    done: set[str] = set()
    while len(done) < len(requests):
        for out in thinker.step():
            if isinstance(out, TokenOutput):
                tokens[out.request_id] += out.token_ids
            elif isinstance(out, StageFinished):
                done.add(out.request_id)
    return tokens


def test_a_long_utterance_is_encoded_over_steps_while_others_decode(thinker) -> None:
    talking = request(thinker, "talking", None, 12)
    thinker.accept(NewRequest(talking))
    thinker.step()  # prefilled: it decodes from now on
    long = request(thinker, "long", features(2 * WINDOW + 123, seed=1), 3)  # three windows
    thinker.accept(NewRequest(long))
    encoded = thinker.audio.encoder.windows_encoded
    per_step = []
    for _ in range(3):
        outs = thinker.step()
        per_step.append(
            (
                thinker.audio.encoder.windows_encoded - encoded,
                any(isinstance(o, TokenOutput) and o.request_id == "talking" for o in outs),
                any(isinstance(o, TokenOutput) and o.request_id == "long" for o in outs),
            )
        )
    # one window a step (the budget), the running request decoding at every step; the long one starts
    # once its last window is encoded
    assert per_step == [(1, True, False), (2, True, False), (3, True, True)]
    while thinker.has_work():
        thinker.step()


def test_windows_sent_ahead_are_used_by_the_turn_and_give_the_same_answer(thinker) -> None:
    mel = features(WINDOW + 300, seed=2)
    alone = run(thinker, request(thinker, "alone", mel, 6))["alone"]
    thinker.accept(EncodeAhead("conv", (np.ascontiguousarray(mel[:, :WINDOW]),)))
    assert thinker.has_work()
    encoded, used = thinker.audio.encoder.windows_encoded, thinker.audio.ahead_used
    while thinker.has_work():
        thinker.step()  # encoded while the caller speaks: no request is waiting for it
    assert thinker.audio.encoder.windows_encoded == encoded + 1
    turn = run(thinker, request(thinker, "turn", mel, 6, key="conv"))["turn"]
    assert thinker.audio.ahead_used == used + 1
    assert thinker.audio.encoder.windows_encoded == encoded + 2  # only the tail at the turn's end
    assert turn == alone
    # kept for the conversation's next request of that audio (a speculative response dropped when the
    # caller spoke on, then the turn's own)
    longer = np.concatenate([mel, features(200, seed=9)], axis=1)
    run(thinker, request(thinker, "resumed", longer, 2, key="conv"))
    assert thinker.audio.ahead_used == used + 2


def test_a_window_whose_features_changed_is_encoded_again(thinker) -> None:
    """The finished clip's features differ from those sent ahead (a louder frame came later and raised
    the floor): the window sent ahead is not used, and the answer is the clip's own."""
    mel = features(WINDOW + 40, seed=3)
    alone = run(thinker, request(thinker, "alone3", mel, 5))["alone3"]
    early = np.ascontiguousarray(mel[:, :WINDOW])
    early[5, 7] += 0.5
    thinker.accept(EncodeAhead("conv3", (early,)))
    used = thinker.audio.ahead_used
    turn = run(thinker, request(thinker, "turn3", mel, 5, key="conv3"))["turn3"]
    assert thinker.audio.ahead_used == used
    assert turn == alone


def test_windows_sent_ahead_must_be_whole_windows(thinker) -> None:
    with pytest.raises(ValueError, match=r"\[128, 800\]"):
        thinker.accept(EncodeAhead("conv4", (features(300, seed=4),)))


def test_a_request_whose_audio_does_not_fit_its_placeholders_is_refused_alone(thinker) -> None:
    """At its arrival, so it never fails the step of the requests running beside it."""
    good = request(thinker, "good", features(150, seed=5), 2)
    bad = request(thinker, "bad", features(150, seed=5), 2)
    short = GenerationRequest(
        "short", Prompt(bad.prompt.input_ids, (features(120, seed=6),)), want_audio=False
    )
    with pytest.raises(ValueError, match="20 placeholders for 16 encoder outputs"):
        thinker.accept(NewRequest(short))
    flat = GenerationRequest(
        "flat", Prompt(bad.prompt.input_ids, (features(150, seed=6)[:80],)), want_audio=False
    )
    with pytest.raises(ValueError, match=r"features must be \[128, frames\]"):
        thinker.accept(NewRequest(flat))
    assert run(thinker, good)["good"]


def test_an_encoder_fault_fails_the_requests_whose_audio_it_held(thinker, monkeypatch) -> None:
    """The stage worker fails a step's active requests (and aborts them in the runner): those include
    the waiting ones whose audio the step encoded, which would otherwise meet the fault at every step."""

    def fault(windows: Any) -> Any:
        raise RuntimeError("the device fell over")

    thinker.accept(NewRequest(request(thinker, "doomed", features(900, seed=8), 2)))
    monkeypatch.setattr(thinker.audio.encoder, "_call", fault)
    with pytest.raises(RuntimeError, match="fell over"):
        thinker.step()
    assert thinker.active_ids() == ["doomed"]
    for rid in thinker.active_ids():
        thinker.abort(rid)  # as the stage worker does with a failed step's requests
    assert not thinker.has_work()
