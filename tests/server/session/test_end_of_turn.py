"""The app's end-of-turn model (`TurnJudge`): pauses asked for together are scored in one run of the
real model, as they would be alone; a model that cannot load fails the pauses, not the server."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

from omnivoice.audio.smart_turn import SmartTurn
from omnivoice.server.session.end_of_turn import TurnJudge, auto_runs
from tests.support.turn_clips import clip


@pytest.fixture(scope="module")
def model() -> SmartTurn:
    return SmartTurn()


async def test_pauses_asked_together_are_scored_in_one_batch(model: SmartTurn) -> None:
    clips = [clip(f"complete/0{i}.wav") for i in range(3)] + [clip("broken/02.wav")[:20000]]
    judge = TurnJudge(load=lambda: model, runs=1)
    scores = await asyncio.gather(*(judge.score(c) for c in clips))
    np.testing.assert_allclose(scores, model.score(clips), atol=1e-4)
    s = judge.stats
    assert s.pauses == 4 and 1 <= s.runs < 4  # the pauses that waited for a run went in one
    assert s.latency_buckets == sorted(s.latency_buckets) and s.latency_buckets[-1] <= 4  # cumulative
    assert s.latency_sum_s > 0
    # a later pause starts a run of its own
    runs = s.runs
    assert await judge.score(clips[0]) == pytest.approx(scores[0], abs=1e-4)
    assert s.pauses == 5 and s.runs == runs + 1
    await judge.close()


async def test_pauses_asked_together_are_split_over_the_free_runs(model: SmartTurn) -> None:
    clips = [clip(f"complete/0{i}.wav") for i in range(3)] + [clip("broken/02.wav")]
    judge = TurnJudge(load=lambda: model, runs=2)
    scores = await asyncio.gather(*(judge.score(c) for c in clips))
    np.testing.assert_allclose(scores, model.score(clips), atol=1e-4)  # as if scored alone
    assert judge.stats.pauses == 4 and judge.stats.runs == 2  # two runs of two, side by side
    # three asked together over three runs: one each
    wide = TurnJudge(load=lambda: model, runs=3)
    await asyncio.gather(*(wide.score(c) for c in clips[:3]))
    assert wide.stats.runs == 3
    await judge.close()
    await wide.close()


def test_runs_default_to_one_per_four_cores() -> None:
    assert auto_runs(2) == 1 and auto_runs(16) == 4 and auto_runs(5) == 1
    assert TurnJudge(runs=0).runs == auto_runs()


async def test_a_model_that_fails_to_load_fails_the_pause_and_loads_again_later(model: SmartTurn) -> None:
    attempts = []

    def load() -> SmartTurn:
        attempts.append(1)
        if len(attempts) == 1:
            return SmartTurn(path=Path("/nonexistent/smart-turn.onnx"))
        return model

    judge = TurnJudge(load=load)
    with pytest.raises(Exception, match=r"nonexistent"):
        await judge.score(clip("complete/02.wav"))
    assert judge.stats.failed == 1
    assert await judge.score(clip("complete/02.wav")) > 0.5
    assert len(attempts) == 2
    await judge.close()
