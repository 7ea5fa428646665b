"""CUDA MPS for the stage processes that share a GPU (`stages.mps`).

Without MPS the CUDA contexts of several processes on one GPU take turns in time slices: while one
stage's kernels run, the other stages' wait, even where those kernels leave most of the GPU's SMs
idle (a decode step at a small batch, a vocoder window). Under MPS (NVIDIA's Multi-Process Service)
the processes' kernels run on the SMs at once, as the streams of one process would.

A pipeline whose stage processes share a CUDA device starts an MPS control daemon of its own
(`nvidia-cuda-mps-control -d`) in a directory of the run directory named after the pipeline's
process (its pid and start time), and passes its pipe and log directories to each stage process in
its environment (CUDA_MPS_PIPE_DIRECTORY, CUDA_MPS_LOG_DIRECTORY), before any of them touches CUDA.
The pipeline quits the daemon when it stops, so a restart of the stages begins with a fresh one: after
a fatal GPU fault an MPS server refuses new clients until every one of its old clients has exited. A
daemon whose pipeline died without stopping (kill -9) is quit at the next start of a pipeline. A quit
returns once the daemon and its MPS server have exited (up to `QUIT_TIMEOUT_S`): the daemon only begins
its shutdown when told, and the server holds the GPU memory of its clients until it ends, so stages
started at once would load beside that memory and find too little for their graphs.

Where an MPS daemon already runs for the machine (the environment names its pipe directory, or the
default one, /tmp/nvidia-mps, has a control socket), the stage processes use it as they are, and the
pipeline leaves it running.

`auto` (the default) starts one where stage processes share a CUDA device and the control program is
found, and otherwise (or if it fails) warns and goes on in time slices; `on` makes that a start error;
`off` never uses one.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import subprocess
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from omnivoice.config import StagesConfig
from omnivoice.engine.leftovers import ProcessId, run_dir
from omnivoice.types import STAGES

log = logging.getLogger(__name__)

CONTROL = "nvidia-cuda-mps-control"
PIPE_ENV = "CUDA_MPS_PIPE_DIRECTORY"
LOG_ENV = "CUDA_MPS_LOG_DIRECTORY"
DEFAULT_PIPE = Path("/tmp/nvidia-mps")  # where CUDA looks when PIPE_ENV is not set
COMMAND_TIMEOUT_S = 10.0
READY_TIMEOUT_S = 5.0
QUIT_TIMEOUT_S = 20.0
MAX_SOCKET_PATH = 108  # bytes of a UNIX socket's path (sun_path), its terminating NUL included


class MpsUnavailable(RuntimeError):
    """`stages.mps: on`, and no MPS daemon could be started."""


@dataclass(frozen=True)
class MpsDaemon:
    """The MPS control daemon the stage processes use: its pipe and log directories, and whether this
    pipeline started it (and quits it) or found it running."""

    pipe: Path
    logs: Path | None
    owned: bool
    home: Path | None = None  # the directory of a daemon this pipeline started

    def env(self) -> dict[str, str]:
        """The environment a stage process needs to be a client of this daemon."""
        env = {PIPE_ENV: str(self.pipe)}
        if self.logs is not None:
            env[LOG_ENV] = str(self.logs)
        return env

    def stop(self) -> None:
        """Quit the daemon if this pipeline started it (and remove its directory)."""
        if self.owned and self.home is not None:
            _quit(self.home)


def mps_client(device: object) -> bool:
    """Whether this process, working on `device`, was started as a client of an MPS daemon (its
    environment names the daemon's pipe directory, and the device is a GPU)."""
    return str(device).startswith("cuda") and bool(os.environ.get(PIPE_ENV))


def shared_devices(stages: StagesConfig) -> list[str]:
    """The CUDA devices that two or more stage processes (`worker: process`) run on."""
    used: Counter[str] = Counter()
    for name in STAGES:
        cfg = stages.stage(name)
        if cfg.worker != "process":
            continue
        for replica in range(cfg.replicas):
            device = cfg.replica_device(replica)
            if device.startswith("cuda"):
                used[device if ":" in device else "cuda:0"] += 1
    return sorted(d for d, n in used.items() if n >= 2)


def mps_root() -> Path:
    """Where the pipelines' own MPS daemons keep their directories: `mps/` of the run directory, or,
    where that path is too long for the daemon's UNIX sockets, a directory of this user's in the
    system's temporary directory."""
    root = run_dir() / "mps"
    longest = root / f"{'9' * 7}-{'9' * 20}" / "pipe" / "control_privileged"
    if len(os.fsencode(longest)) < MAX_SOCKET_PATH:
        return root
    return Path(tempfile.gettempdir()) / f"omnivoice-mps-{os.getuid()}"


def start_mps(stages: StagesConfig) -> MpsDaemon | None:
    """The MPS daemon for this pipeline's stage processes (see the module docstring); None: the
    processes share no GPU, `mps` is off, or (auto) none could be started."""
    if stages.mps == "off":
        return None
    shared = shared_devices(stages)
    if not shared:
        if stages.mps == "on":
            log.info("stages.mps: on, but no CUDA device is shared by stage processes: no MPS daemon")
        return None
    given = os.environ.get(PIPE_ENV)
    running = Path(given) if given else DEFAULT_PIPE
    if (running / "control").exists():
        log.info("stage processes on %s use the MPS daemon already running (%s)", ", ".join(shared), running)
        return MpsDaemon(running, Path(v) if (v := os.environ.get(LOG_ENV)) else None, owned=False)
    program = shutil.which(CONTROL)
    if program is None:
        _without(stages, f"no {CONTROL} on PATH", shared)
        return None
    quit_leftovers()
    owner = ProcessId.of(os.getpid())
    home = mps_root() / (f"{owner.pid}-{owner.start}" if owner is not None else str(os.getpid()))
    _quit(home)  # a daemon of an earlier pipeline of this process that did not stop
    pipe, logs = home / "pipe", home / "log"
    said = home / "started.txt"  # what the program printed: a file, since the daemon it forks keeps
    try:  # the descriptors it was given, and a pipe would then never reach its end
        for d in (home.parent, pipe, logs):
            d.mkdir(parents=True, exist_ok=True, mode=0o700)
        with said.open("w") as out:
            done = subprocess.run(
                [program, "-d"],
                env={**os.environ, PIPE_ENV: str(pipe), LOG_ENV: str(logs)},
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                timeout=COMMAND_TIMEOUT_S,
                check=False,
            )
    except (OSError, subprocess.SubprocessError) as e:
        shutil.rmtree(home, ignore_errors=True)
        _without(stages, f"{CONTROL} -d failed: {e}", shared)
        return None
    if done.returncode != 0 or not _wait_for(pipe / "control"):
        printed = said.read_text(errors="replace").strip() if said.exists() else ""
        why = printed or f"exit code {done.returncode}, no control socket"
        _quit(home)
        _without(stages, f"{CONTROL} -d failed: {why}", shared)
        return None
    devices = ", ".join(shared)
    log.info("stage processes on %s share the GPU through CUDA MPS (control daemon in %s)", devices, home)
    return MpsDaemon(pipe, logs, owned=True, home=home)


def quit_leftovers() -> list[Path]:
    """Quit the MPS daemons whose pipelines are gone (a kill -9) and remove their directories; the
    directories quit."""
    try:
        homes = sorted(p for p in mps_root().iterdir() if p.is_dir())
    except OSError:
        return []
    gone = []
    for home in homes:
        pid, _, start = home.name.partition("-")
        if not (pid.isdigit() and start.isdigit()):
            continue
        if ProcessId(int(pid), int(start)).running():
            continue
        log.warning("quitting the MPS daemon that a stopped engine left running (%s)", home)
        _quit(home)
        gone.append(home)
    return gone


def _without(stages: StagesConfig, why: str, shared: list[str]) -> None:
    if stages.mps == "on":
        raise MpsUnavailable(f"stages.mps is on, but no MPS daemon could be started: {why}")
    log.warning(
        "no CUDA MPS for the stage processes on %s (%s): they take turns on the GPU in time slices",
        ", ".join(shared),
        why,
    )


def _wait_for(path: Path) -> bool:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while not path.exists():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def _quit(home: Path) -> None:
    """Quit the daemon of directory `home` (if one answers there), wait up to `QUIT_TIMEOUT_S` for its
    processes to exit, and remove the directory."""
    pipe = home / "pipe"
    program = shutil.which(CONTROL)
    if program is not None and (pipe / "control").exists():
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            subprocess.run(
                [program],
                input="quit\n",
                env={**os.environ, PIPE_ENV: str(pipe), LOG_ENV: str(home / "log")},
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                text=True,
                timeout=COMMAND_TIMEOUT_S,
                check=False,
            )
        _wait_for_exit(pipe, QUIT_TIMEOUT_S)
    shutil.rmtree(home, ignore_errors=True)


def _wait_for_exit(pipe: Path, timeout_s: float) -> None:
    """Wait until no process started for the daemon of `pipe` runs any more, or `timeout_s` passed."""
    began = time.monotonic()
    left = daemon_processes(pipe)
    while left and time.monotonic() - began < timeout_s:
        time.sleep(0.05)
        left = daemon_processes(pipe)
    waited = time.monotonic() - began
    if left:
        pids = ", ".join(map(str, left))
        log.warning(
            "the MPS daemon of %s still runs %.0f s after it was told to quit (pids %s)", pipe, waited, pids
        )
    elif waited >= 1.0:
        log.info("the MPS daemon of %s took %.1f s to exit", pipe, waited)


def daemon_processes(pipe: Path) -> list[int]:
    """The processes other than this one whose environment names `pipe` as their MPS pipe directory:
    the control daemon started for it, the MPS server that daemon started, and any client still
    running. Processes this user cannot read are not seen."""
    wanted = f"{PIPE_ENV}={pipe}".encode()
    me = os.getpid()
    found = []
    try:
        entries = list(Path("/proc").iterdir())
    except OSError:
        return []
    for entry in entries:
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:  # gone meanwhile, or another user's
            continue
        if wanted in environ.split(b"\0"):
            found.append(int(entry.name))
    return sorted(found)
