"""`omnivoice` CLI: help texts, `profile check`, the CPU profile, and `serve`'s failure path."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from omnivoice.cli import main
from omnivoice.config import Profile, load_profile
from omnivoice.server.app import run_server

ROOT = Path(__file__).resolve().parents[1]
CPU_YAML = ROOT / "configs" / "cpu.yaml"


@pytest.mark.parametrize(
    ("argv", "needles"),
    [
        ([], ["serve", "bench", "profile"]),
        (["serve"], ["--profile", "--host", "--log-level", "--insecure-no-auth", "OMNIVOICE_API_KEY"]),
        (["bench"], ["--base-url", "--concurrency"]),
        (["bench", "soak"], ["--disconnects", "--barge-in", "--linger-s", "/v1/debug/state", "exits 1"]),
        (["profile"], ["check"]),
        (["profile", "check"], ["PATH", "exit 2"]),
    ],
)
def test_help(argv: list[str], needles: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main([*argv, "--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    for needle in needles:
        assert needle in out


def test_python_dash_m_entry_point() -> None:
    r = subprocess.run(
        [sys.executable, "-m", "omnivoice", "--help"], capture_output=True, text=True, cwd=ROOT
    )
    assert r.returncode == 0 and "serve" in r.stdout


def test_missing_command_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main([])
    assert exc.value.code == 2


@pytest.mark.parametrize("name", ["cpu.yaml", "h200.yaml", "h200-dummy.yaml", "h100-dummy.yaml"])
def test_profile_check_shipped_profiles(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    path = ROOT / "configs" / name
    assert main(["profile", "check", str(path)]) == 0
    assert capsys.readouterr().out.strip() == f"{path}: ok"


@pytest.mark.parametrize(
    ("text", "needles"),
    [
        ("server:\n  prot: 80\n", ["server.prot: unknown key"]),
        ("stages:\n  talker:\n    max_batch: zero\n", ["stages.talker.max_batch"]),
        ("server:\n  port: 70000\n  log_level: loud\n", ["server.port", "server.log_level"]),
        ("- a\n- b\n", ["top level must be a mapping"]),
        ("model: [unclosed\n", ["not valid YAML"]),
    ],
)
def test_profile_check_bad_files(text: str, needles: list[str], tmp_path: Path, capsys) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    assert main(["profile", "check", str(path)]) == 2
    err = capsys.readouterr().err
    for needle in needles:
        assert needle in err


def test_profile_check_missing_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["profile", "check", str(tmp_path / "nope.yaml")]) == 2
    assert "cannot read profile" in capsys.readouterr().err


def test_cpu_profile_is_the_default_with_every_key_spelled_out() -> None:
    assert load_profile(CPU_YAML) == Profile()
    assert yaml.safe_load(CPU_YAML.read_text()) == Profile().model_dump()


def test_serve_with_a_bad_profile_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("server:\n  hots: 0.0.0.0\n")
    assert main(["serve", "--profile", str(path)]) == 2
    assert "server.hots: unknown key" in capsys.readouterr().err


def test_serve_refuses_a_public_host_without_a_key(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("OMNIVOICE_API_KEY", raising=False)
    assert main(["serve", "--host", "0.0.0.0", "--port", "1"]) == 2  # refused before binding anything
    err = capsys.readouterr().err
    assert "refusing to listen on 0.0.0.0 without an API key" in err
    assert "OMNIVOICE_API_KEY" in err and "--insecure-no-auth" in err


def test_serve_reports_an_unreadable_key_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(f"auth:\n  api_key_file: {tmp_path / 'missing'}\n")
    assert main(["serve", "--profile", str(path)]) == 2
    assert "auth.api_key_file: cannot read" in capsys.readouterr().err


def test_a_signal_while_the_engine_starts_is_a_clean_stop(caplog: pytest.LogCaptureFixture) -> None:
    closed: list[bool] = []

    class Slow:
        def hold_restarts(self) -> None: ...

        async def close(self) -> None:
            closed.append(True)

    async def slow(profile: Profile) -> object:
        asyncio.get_running_loop().call_later(0.5, os.kill, os.getpid(), signal.SIGTERM)
        await asyncio.sleep(1.5)  # still starting when the signal comes
        return Slow()

    with caplog.at_level(logging.INFO):
        rc = asyncio.run(run_server(Profile(), "127.0.0.1", 0, "warning", engine_factory=slow))
    assert rc == 0 and closed == [True]
    assert "shut down while it was starting" in caplog.text
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text


def test_run_server_exits_1_when_the_engine_fails(caplog: pytest.LogCaptureFixture) -> None:
    async def broken(profile: Profile) -> object:
        raise RuntimeError("no weights here")

    with caplog.at_level(logging.INFO):
        rc = asyncio.run(run_server(Profile(), "127.0.0.1", 0, "warning", engine_factory=broken))
    assert rc == 1
    assert "engine failed to start (RuntimeError: no weights here)" in caplog.text
