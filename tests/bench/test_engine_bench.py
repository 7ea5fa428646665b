"""`omnivoice bench engine`: the in-process engine benchmark, on the tiny checkpoint and a shrunk dummy."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from omnivoice.bench.engine_load import EngineLoadConfig, chat_prompt, run_engine_load
from omnivoice.bench.metrics import summarize
from omnivoice.cli import main
from omnivoice.config import parse_profile
from omnivoice.engine.engine import Engine
from omnivoice.models.dummy import NEWLINE_ID, REDUCED, DummySource, dummy_spec

STAGE = {"worker": "thread", "max_batch": 4, "max_seq_len": 256}
STAGES = {"thinker": STAGE, "talker": STAGE, "code2wav": STAGE}
FRAMES = 10  # 0.8 s of audio per request


def test_cli_reports_engine_and_transformers_baseline(tiny_checkpoint: Path, tmp_path: Path) -> None:
    profile = tmp_path / "tiny.yaml"
    profile.write_text(yaml.safe_dump({"model": {"path": str(tiny_checkpoint)}, "stages": STAGES}))
    out = tmp_path / "report.json"
    argv = ["bench", "engine", "--profile", str(profile), "--concurrency", "2", "--num-prompts", "3"]
    argv += ["--warmups", "1", "--prompt-tokens", "24", "--text-tokens", "6", "--audio-frames", str(FRAMES)]
    argv += ["--baseline", "transformers", "--baseline-requests", "1", "--output-json", str(out), "--quiet"]
    assert main(argv) == 0
    report = json.loads(out.read_text())
    for key in ("machine", "engine", "concurrency", "requests", "mean_ttfp_ms", "p99_ttfp_ms", "mean_rtf"):
        assert report[key] is not None, key
    assert report["concurrency"] == 2 and report["requests"] == 3 and report["errors"] == 0
    assert report["text_tokens"] == 3 * 6 and report["output_tok_per_s"] > 0
    assert report["mean_prompt_tokens"] == 24  # as the engine counted the prompts it was given
    assert report["audio_s_per_s"] > 0 and report["mean_ttft_ms"] <= report["mean_ttfp_ms"]
    assert {s["name"] for s in report["stages"]} == {"thinker", "talker", "code2wav"}
    assert all(s["steps"] > 0 and s["busy_s"] > 0 for s in report["stages"])
    parts = report["mean_first_audio_ms"]  # where the wait for the first audio went, stage by stage
    assert set(parts) == {
        "to_first_token_ms",
        "to_talker_ms",
        "talker_frames_ms",
        "to_code2wav_ms",
        "decode_ms",
        "to_engine_ms",
    }
    assert parts["talker_frames_ms"] > 0 and parts["decode_ms"] > 0
    base = report["baseline"]
    assert base["engine"].startswith("transformers") and base["concurrency"] == 1
    assert base["requests"] == 1 and base["errors"] == 0 and base["text_tokens"] == 6
    # the engine's streamed audio is gap-free: as long as generate()'s one-piece decode of the same frames
    assert report["audio_seconds"] == pytest.approx(3 * base["audio_seconds"], abs=2e-3)
    assert 0.9 * FRAMES * 0.08 < base["audio_seconds"] <= FRAMES * 0.08
    assert base["mean_ttfp_ms"] == base["mean_latency_ms"]  # not streaming: all audio at the end


def test_several_concurrencies_run_on_one_engine_start_each_with_its_report(
    tiny_checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    profile = tmp_path / "tiny.yaml"
    profile.write_text(yaml.safe_dump({"model": {"path": str(tiny_checkpoint)}, "stages": STAGES}))
    argv = ["bench", "engine", "--profile", str(profile), "--concurrency", "2", "1"]
    argv += ["--num-prompts", "4", "2"]
    argv += ["--warmups", "0", "--prompt-tokens", "24", "--text-tokens", "4", "--audio-frames", str(FRAMES)]
    argv += ["--output-json", str(tmp_path / "r.json"), "--records", str(tmp_path / "r.jsonl"), "--quiet"]
    assert main(argv) == 0
    assert capsys.readouterr().err.count("engine ready in") == 1
    for c, n in ((2, 4), (1, 2)):
        report = json.loads((tmp_path / f"r-c{c}.json").read_text())
        assert report["concurrency"] == c and report["requests"] == n and report["errors"] == 0
        assert report["engine_start_s"] > 0 and report["warmups"] == 0
        assert len((tmp_path / f"r-c{c}.jsonl").read_text().splitlines()) == n
    assert not (tmp_path / "r.json").exists()
    bad = [*argv[:7], "--num-prompts", "4", "2", "1"]
    assert main(bad) == 2
    assert "--num-prompts takes one value or one per --concurrency value" in capsys.readouterr().err


def test_chat_prompt_uses_the_model_ids_and_plain_text() -> None:
    spec = dummy_spec(DummySource("qwen3-omni-30b-a3b"))
    ids = chat_prompt(spec, 128, np.random.default_rng(0), NEWLINE_ID).input_ids
    assert len(ids) == 128
    assert ids[:3] == (151644, 872, 198) and ids[-5:] == (151645, 198, 151644, 77091, 198)
    assert all(0 <= i < 151643 for i in ids[3:-5])


async def test_dummy_model_runs_through_the_staged_engine_on_token_ids(tmp_path: Path) -> None:
    source = DummySource("qwen3-omni-30b-a3b", overrides=REDUCED)
    profile = parse_profile({"model": {"cache_dir": str(tmp_path)}, "stages": STAGES})
    engine = await Engine.start(profile, source=source)
    try:
        cfg = EngineLoadConfig(
            2, concurrency=2, warmups=0, prompt_tokens=16, text_tokens=4, audio_frames=FRAMES
        )
        result = await run_engine_load(engine, cfg, NEWLINE_ID)
    finally:
        await engine.close()
    summary = summarize(result.records, result.duration_s)
    assert summary.requests == 2 and summary.errors == 0
    assert summary.text_tokens == 2 * 4  # counted from ids
    assert 2 * 0.9 * FRAMES * 0.08 < summary.audio_seconds <= 2 * FRAMES * 0.08


def test_engine_bench_imports_without_the_server_stack() -> None:
    """The H200 image has no starlette, uvicorn, soxr, soundfile or av: the engine path must not need them."""
    code = (
        "import sys\n"
        "for m in ('starlette', 'uvicorn', 'soxr', 'soundfile', 'av'): sys.modules[m] = None\n"
        "from omnivoice.cli import build_parser\n"
        "import omnivoice.bench.engine_cli, omnivoice.bench.engine_load, omnivoice.bench.baseline\n"
        "import omnivoice.engine.engine, omnivoice.runners.factory, omnivoice.models.dummy\n"
        "import omnivoice.runners.thinker, omnivoice.runners.talker, omnivoice.runners.code2wav\n"
        "assert build_parser().parse_args(['bench', 'engine', '--profile', 'p']).bench_mode == 'engine'\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


def test_the_bench_waits_for_the_graphs_the_stages_capture_after_the_start() -> None:
    from omnivoice.bench.engine_cli import wait_for_graphs
    from omnivoice.types import StageStats

    reports = iter([3, 3, 1, 0])  # graphs pending, as the stage reports them each time it is asked
    asked: list[int] = []

    def replica_stats() -> tuple[StageStats, ...]:
        pending = next(reports)
        asked.append(pending)
        return (StageStats("code2wav", 0, 0, 0, 0, graphs_pending=pending),)

    waited = wait_for_graphs(replica_stats)
    assert asked == [3, 3, 1, 0] and waited is not None and waited >= 0
    none_pending = (StageStats("talker", 0, 0, 0, 0),)
    assert wait_for_graphs(lambda: none_pending) is None  # nothing to wait for: no delay, no message
    assert (
        wait_for_graphs(lambda: (StageStats("talker", 0, 0, 0, 0, graphs_pending=2),), limit_s=0.0)
        is not None
    )
