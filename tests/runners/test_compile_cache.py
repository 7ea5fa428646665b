"""Compiled artifacts kept across processes: reused by a second start, rebuilt on a changed key or a
corrupt entry (never a failed start)."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import subprocess
import sys
from dataclasses import asdict, replace
from pathlib import Path

import pytest
import torch

from omnivoice.runners.compile_cache import (
    ARTIFACTS,
    KEY,
    CompiledArtifacts,
    artifact_key,
    use_compile_caches_under,
)

REPO = Path(__file__).resolve().parents[2]


def _key(shapes: str = "a"):
    return artifact_key("toy0", "toy", {"shapes": shapes}, torch.device("cpu"))


def _plant(folder: Path, key, data: bytes, sha: str | None = None) -> None:
    folder.mkdir(parents=True)
    (folder / ARTIFACTS).write_bytes(data)
    sha = sha if sha is not None else hashlib.sha256(data).hexdigest()
    (folder / KEY).write_text(json.dumps({**asdict(key), "sha256": sha}))


def test_the_key_names_what_changed() -> None:
    key = _key()
    assert key.device == "cpu" and key.torch == torch.__version__
    other = replace(key, torch="0.0")
    assert key.digest() != other.digest() and key.digest() != _key("b").digest()
    assert key.changes_from(asdict(other)) == ["torch"]
    assert key.changes_from(asdict(_key("b"))) == ["settings"]


@pytest.mark.parametrize("checksum", ["wrong", "right"])
def test_a_corrupt_entry_is_removed_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, checksum: str
) -> None:
    key = _key()
    kept = CompiledArtifacts(tmp_path, key)
    # "right": bytes that match their checksum but that torch cannot read (a file of another format)
    _plant(kept.folder, key, b"\x00not artifacts", sha="0" * 64 if checksum == "wrong" else None)
    with caplog.at_level(logging.WARNING):
        assert kept.load() is False
    assert "corrupt" in caplog.text and not kept.folder.exists()
    assert CompiledArtifacts(tmp_path, key).load() is False  # then simply missing


def test_artifacts_of_another_key_are_not_loaded(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    old = CompiledArtifacts(tmp_path, _key("a"))
    _plant(old.folder, old.key, b"whatever")
    with caplog.at_level(logging.INFO):
        assert CompiledArtifacts(tmp_path, _key("b")).load() is False
    assert "kept for another settings" in caplog.text
    assert old.folder.exists()  # removed once the new key's artifacts are kept


def test_inductor_and_triton_caches_go_under_the_cache_dir_unless_set(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    monkeypatch.delenv("TRITON_CACHE_DIR", raising=False)
    use_compile_caches_under(tmp_path)
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "inductor")
    assert os.environ["TRITON_CACHE_DIR"] == str(tmp_path / "triton")
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "/somewhere/else")
    monkeypatch.setenv("TRITON_CACHE_DIR", "/elsewhere")
    use_compile_caches_under(tmp_path)
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == "/somewhere/else"
    assert os.environ["TRITON_CACHE_DIR"] == "/elsewhere"


# A start in miniature: load the kept artifacts, compile a function, keep what was compiled.
_START = """
import logging, sys
from pathlib import Path
import torch
from omnivoice.runners.compile_cache import CompiledArtifacts, artifact_key
logging.basicConfig(level=logging.INFO, stream=sys.stdout, format="%(levelname)s %(message)s")
key = artifact_key("toy0", "toy", {"shapes": sys.argv[2]}, torch.device("cpu"))
kept = CompiledArtifacts(Path(sys.argv[1]), key)
kept.load()
fn = torch.compile(lambda x: torch.sin(x) * 2 + 1, dynamic=True, fullgraph=True)
assert torch.allclose(fn(torch.ones(8)), torch.sin(torch.ones(8)) * 2 + 1)
kept.save()
"""


def _start(root: Path, inductor: Path, shapes: str = "a") -> str:
    """A fresh process with a fresh inductor cache folder (nothing reused but the kept file)."""
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(inductor), "TORCHINDUCTOR_COMPILE_THREADS": "1"}
    env["PYTHONPATH"] = str(REPO)
    done = subprocess.run(
        [sys.executable, "-c", _START, str(root), shapes],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


@pytest.mark.slow
@pytest.mark.timeout(2400)
def test_kept_artifacts_serve_a_second_process_and_are_rebuilt_when_needed(tmp_path: Path) -> None:
    root = tmp_path / "compiled"
    first = _start(root, tmp_path / "inductor-1")
    assert "no compiled artifacts kept for toy0 yet" in first and "compiled artifacts kept" in first
    (folder,) = list(root.iterdir())

    second = _start(root, tmp_path / "inductor-2")
    assert "compiled artifacts reused" in second
    assert "graphs reused, 0 compiled" in second and "compiled artifacts kept" not in second

    (folder / ARTIFACTS).write_bytes((folder / ARTIFACTS).read_bytes()[:100])  # a torn write
    third = _start(root, tmp_path / "inductor-3")
    assert "WARNING compiled artifacts in" in third and "corrupt" in third
    assert "compiled artifacts kept" in third and CompiledArtifacts(root, _key()).folder.exists()

    fourth = _start(root, tmp_path / "inductor-4", shapes="b")  # another key: compiled afresh
    assert "kept for another settings" in fourth and "compiled artifacts kept" in fourth
    assert [p.name for p in root.iterdir()] == [CompiledArtifacts(root, _key("b")).folder.name]
