"""docker/: the compose file is well-formed and points at what exists, and the images install and
serve what the README, docs/deployment.md and .ci/run say. (hadolint lints the Dockerfiles in
.ci/run; no Docker engine runs in CI, so nothing here builds an image.)"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
import yaml

from omnivoice.config import load_profile

ROOT = Path(__file__).resolve().parents[1]
DOCKER = ROOT / "docker"
DOCKERFILES = sorted(DOCKER.glob("*.Dockerfile"))


def _instructions(dockerfile: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments): comment lines dropped first (as Docker does), then continuations joined."""
    code = "\n".join(ln for ln in dockerfile.read_text().splitlines() if not ln.lstrip().startswith("#"))
    lines = [ln.strip() for ln in code.replace("\\\n", " ").splitlines() if ln.strip()]
    return [(ln.split(None, 1)[0].upper(), ln.split(None, 1)[1]) for ln in lines]


def _profile_path(argv: list[str]) -> Path:
    """The shipped configs/ file that `--profile /configs/NAME` names."""
    profile = argv[argv.index("--profile") + 1]
    assert profile.startswith("/configs/"), profile
    return ROOT / "configs" / profile.removeprefix("/configs/")


def _target(volume: str) -> str:
    """Where a compose short-syntax volume (SOURCE:TARGET[:MODE]) is mounted."""
    parts = volume.split(":")
    return parts[-2] if parts[-1] in ("ro", "rw") else parts[-1]


def _ci_torch_pin() -> str:
    match = re.search(r'^TORCH_SPEC="(torch==[^"]+)"', (ROOT / ".ci" / "run").read_text(), re.M)
    assert match, ".ci/run has no TORCH_SPEC"
    return match.group(1)


def test_both_images_exist() -> None:
    assert [p.name for p in DOCKERFILES] == ["cpu.Dockerfile", "cuda.Dockerfile"]


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.stem)
def test_image_serves_a_shipped_profile_as_non_root_with_a_healthcheck(dockerfile: Path) -> None:
    ins = _instructions(dockerfile)
    args = {name: [a for n, a in ins if n == name] for name in {n for n, _ in ins}}
    assert ins[0][0] == "FROM" and len(args["FROM"]) == 1
    entrypoint = yaml.safe_load(args["ENTRYPOINT"][-1])
    cmd = yaml.safe_load(args["CMD"][-1])  # exec form: a JSON list
    assert entrypoint == ["omnivoice"]
    assert cmd[:3] == ["serve", "--host", "0.0.0.0"]
    load_profile(_profile_path(cmd))  # exists and is valid
    assert "/health" in args["HEALTHCHECK"][-1]
    assert re.fullmatch(r"[1-9]\d*(:\d+)?", args["USER"][-1]), "numeric, non-root user"
    assert args["VOLUME"] == ['["/home/omnivoice/.cache/omnivoice"]']  # the tiny model's cache
    assert "configs /configs" in args["COPY"]
    # torch first, with the same pin as .ci/run (and the README), then the project without -e
    pins = re.findall(r"\btorch==[\w.+]+", " ".join(args["RUN"]))
    assert pins == [_ci_torch_pin()]
    assert f"pip install {_ci_torch_pin()}" in (ROOT / "README.md").read_text()
    installs = [a for a in args["RUN"] if re.search(r"pip install --no-cache-dir \"?\.", a)]
    assert len(installs) == 1 and " -e " not in installs[0]


def test_compose_runs_the_cuda_image_on_a_reserved_gpu_with_the_checkpoint_read_only() -> None:
    compose = yaml.safe_load((DOCKER / "compose.yaml").read_text())
    assert set(compose["services"]) == {"omnivoice"}
    svc = compose["services"]["omnivoice"]
    assert (DOCKER / svc["build"]["context"] / svc["build"]["dockerfile"]).resolve() == (
        DOCKER / "cuda.Dockerfile"
    )
    profile_file = _profile_path(svc["command"])
    assert profile_file.name == "h200.yaml"
    profile = load_profile(profile_file)
    mounts = {_target(v): v for v in svc["volumes"]}
    assert mounts["/configs"] == "../configs:/configs:ro"
    checkpoint = mounts[profile.model.path]  # the folder the profile loads, mounted there
    assert checkpoint.endswith(":ro")
    assert "omnivoice-cache" in compose["volumes"]
    (gpu,) = svc["deploy"]["resources"]["reservations"]["devices"]
    assert gpu["driver"] == "nvidia" and gpu["capabilities"] == ["gpu"]
    assert svc["ports"] == ["8000:8000"]
    # it listens on 0.0.0.0, which the server refuses without an API key: compose insists on one
    assert svc["environment"]["OMNIVOICE_API_KEY"].startswith("${OMNIVOICE_API_KEY:?")


def test_documented_container_commands_name_the_files_there_are() -> None:
    page = (ROOT / "docs" / "deployment.md").read_text()
    section = page.split("## Containers", 1)[1].split("\n## ", 1)[0]
    for line in section.splitlines():
        if line.startswith(("docker build", "docker compose", "OMNIVOICE_CHECKPOINT=")):
            argv = shlex.split(line.split("#")[0])
            files = [argv[i + 1] for i, a in enumerate(argv) if a == "-f"]
            assert files and all((ROOT / f).is_file() for f in files), line
    for dockerfile in DOCKERFILES:
        assert f"docker build -f docker/{dockerfile.name}" in section
