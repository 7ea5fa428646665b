"""Stage processes ignore SIGTERM and SIGINT (the server stops them), so a process that exits without
stopping its stages must end them itself: multiprocessing's exit handler would signal them with
SIGTERM and then wait for them forever."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from tests.support.serve_process import alive

SCRIPT = textwrap.dedent(
    """
    import sys
    from pathlib import Path

    from omnivoice.config import parse_profile
    from omnivoice.engine.pipeline import Pipeline

    checkpoint = Path(sys.argv[1])
    stage = {"max_seq_len": 256, "max_batch": 2}
    profile = parse_profile({
        "model": {"path": str(checkpoint)},
        "stages": {
            "thinker": {**stage, "worker": "process"},
            "talker": {**stage, "worker": "thread"},
            "code2wav": {**stage, "worker": "thread"},
        },
    })
    pipe = Pipeline.start(profile, checkpoint)
    print("worker", pipe.processes[0].pid, flush=True)
    sys.exit(0)  # without pipe.stop(), as a server whose shutdown failed or never ran
    """
)


def test_a_process_that_exits_without_stopping_its_stages_ends_them(
    tiny_checkpoint: Path, tmp_path: Path
) -> None:
    env = {**os.environ, "OMNIVOICE_RUN_DIR": str(tmp_path / "run")}
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(tiny_checkpoint)],
        capture_output=True, text=True, env=env, timeout=180,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    worker = int(next(line for line in done.stdout.splitlines() if line.startswith("worker")).split()[1])
    assert not alive(worker)  # killed and reaped before the script exited
    assert not list((tmp_path / "run").glob("*.json"))
