"""`omnivoice bench ab` end to end against two commits of a small git repository whose `omnivoice`
is a stand-in server (stdlib HTTP: /health, /v1/models naming its commit, a streamed chat answer with
one text and one audio chunk). The real client measures it; checked: which revision served each run,
the alternation, the figures' comparison, the profile each side serves, and the exit codes `git bisect
run` reads."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import omnivoice
from omnivoice.bench.ab_cli import add_arguments, side_profile

ROOT = Path(omnivoice.__file__).resolve().parent.parent

FAKE_SERVER = """
import base64, json, sys, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

NAME, DELAY_S, BROKEN = {name!r}, {delay_s!r}, {broken!r}


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def _json(self, body):
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        if self.path == "/health":
            self._json({{"status": "ok"}})
        else:
            self._json({{"data": [{{"id": NAME + PROFILE, "owned_by": "fake"}}]}})

    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        time.sleep(DELAY_S)
        pcm = base64.b64encode(bytes(4800)).decode()
        for delta in ({{"content": "hi"}}, {{"audio": {{"data": pcm}}}}):
            chunk = {{"choices": [{{"delta": delta}}]}}
            self.wfile.write(f"data: {{json.dumps(chunk)}}\\n\\n".encode())
        self.wfile.write(b"data: [DONE]\\n\\n")


if __name__ == "__main__":
    if BROKEN:
        sys.exit(3)
    argv = sys.argv
    port = int(argv[argv.index("--port") + 1])
    PROFILE = "@" + argv[argv.index("--profile") + 1] if "--profile" in argv else ""
    ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()
"""


def _commit(repo: Path, name: str, delay_s: float = 0.0, broken: bool = False) -> None:
    pkg = repo / "omnivoice"
    pkg.mkdir(exist_ok=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "__main__.py").write_text(FAKE_SERVER.format(name=name, delay_s=delay_s, broken=broken))
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "add", "-A"], check=True, capture_output=True)
    subprocess.run([*git, "commit", "-qm", name], check=True, capture_output=True)


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """Commits: rev-one (answers at once), rev-two (each answer 0.5 s late), broken (exits at start)."""
    repo = tmp_path / "repo"
    repo.mkdir()
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    _commit(repo, "rev-one")
    _commit(repo, "rev-two", delay_s=0.5)
    _commit(repo, "broken", broken=True)
    return repo


def _ab(repo: Path, tmp_path: Path, *args: str) -> tuple[int, dict | None, str]:
    out = tmp_path / "ab.json"
    out.unlink(missing_ok=True)
    client = ["--num-prompts", "2", "--warmups", "0", "--max-tokens", "4"]
    options = ["--repo", str(repo), "--output-json", str(out), "--ready-timeout", "120"]
    done = subprocess.run(
        [sys.executable, "-m", "omnivoice", "bench", "ab", *args, *options, "--", *client],
        capture_output=True,
        text=True,
        cwd=tmp_path,  # not the tree under test: the tool must import itself through PYTHONPATH
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=600,
    )
    report = json.loads(out.read_text()) if out.exists() else None
    return done.returncode, report, done.stderr + done.stdout


@pytest.mark.slow
def test_two_revisions_are_served_in_turn_and_compared(repo: Path, tmp_path: Path) -> None:
    rc, report, err = _ab(repo, tmp_path, "HEAD~2", "HEAD~1", "--runs", "2")
    assert rc == 0, err
    assert report is not None
    assert report["order"] == ["A0", "B0", "B1", "A1"]
    commits = {
        side: subprocess.run(
            ["git", "-C", str(repo), "rev-parse", rev], capture_output=True, text=True, check=True
        ).stdout.strip()
        for side, rev in (("A", "HEAD~2"), ("B", "HEAD~1"))
    }
    assert report["a"]["commit"] == commits["A"] and report["b"]["commit"] == commits["B"]
    for run in report["runs"]:  # each run was answered by its own revision's server
        assert run["error"] is None
        assert run["commit"] == commits[run["side"]]
        assert run["client_report"]["model"] == {"A": "rev-one", "B": "rev-two"}[run["side"]]
        assert run["client_report"]["requests"] == 2
        assert run["metrics"]["server_cpu_s"] >= 0
        assert len(run["cpu_by_process"]) >= 1  # the server process at least, by pid
        assert sum(run["cpu_by_process"].values()) == pytest.approx(run["metrics"]["server_cpu_s"])
    latency = report["comparisons"]["latency_ms"]
    assert (latency["runs_a"], latency["runs_b"]) == (2, 2)
    assert latency["ratio"] == pytest.approx(latency["mean_b"] / latency["mean_a"])
    assert latency["ci_low"] <= latency["ratio"] <= latency["ci_high"]
    assert latency["paired_min"] <= latency["paired_max"]
    assert "ttfp_ms" in report["comparisons"]
    assert "run 4/4" in err and "B/A" in err  # progress, then the table


@pytest.mark.slow
def test_the_exit_code_tells_git_bisect_good_bad_or_skip(repo: Path, tmp_path: Path) -> None:
    # B answers 0.5 s late on every request, A at once: far above a gate of 1.0, far below 1000
    rc, _, err = _ab(repo, tmp_path, "HEAD~2", "HEAD~1", "--runs", "1", "--fail-above", "1.0")
    assert rc == 1, err
    rc, _, err = _ab(repo, tmp_path, "HEAD~2", "HEAD~1", "--runs", "1", "--fail-above", "1000")
    assert rc == 0, err
    rc, report, err = _ab(repo, tmp_path, "HEAD~2", "HEAD", "--runs", "1", "--fail-above", "1.05")
    assert rc == 125, err  # B cannot be served: bisect skips it
    assert "cannot be served" in err and "exited with code 3" in err and report is None
    rc, _, err = _ab(repo, tmp_path, "HEAD", "HEAD~2", "--runs", "1")
    assert rc == 128, err  # the reference cannot: bisect stops
    rc, _, err = _ab(repo, tmp_path, "no-such-rev", "HEAD", "--runs", "1")
    assert rc == 2 and "not a commit" in err


@pytest.mark.slow
def test_one_side_serves_its_own_profile(repo: Path, tmp_path: Path) -> None:
    profile = tmp_path / "b.yaml"
    profile.write_text("{}\n")
    rc, report, err = _ab(repo, tmp_path, "HEAD~2", "HEAD~1", "--runs", "1", "--profile-b", str(profile))
    assert rc == 0, err
    assert report is not None and report["profiles"] == {"A": None, "B": str(profile)}
    models = {run["side"]: run["client_report"]["model"] for run in report["runs"]}
    assert models == {"A": "rev-one", "B": f"rev-two@{profile}"}  # as each server was started


def test_a_side_profile_overrides_the_common_one() -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["a", "b", "--profile", "both.yaml", "--profile-b", "new.yaml"])
    assert (side_profile(args, "A"), side_profile(args, "B")) == ("both.yaml", "new.yaml")
    args = parser.parse_args(["a", "b", "--profile-a", "old.yaml"])
    assert (side_profile(args, "A"), side_profile(args, "B")) == ("old.yaml", None)
