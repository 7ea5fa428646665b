"""Runs a kernel check module under Triton's interpreter and returns what it printed last.

The interpreter is chosen when Triton compiles a kernel (at import), so a CPU test of the GPU kernels
runs its check module in a subprocess with TRITON_INTERPRET=1; the module prints its figures as a
Python literal on its last line.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[3]


def interpreted(module: str, *args: str, timeout: float = 300) -> Any:
    """`python -m <module> <args>` under the interpreter -> its last stdout line, evaluated."""
    done = subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=ROOT,
        env={**os.environ, "TRITON_INTERPRET": "1"},
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return ast.literal_eval(done.stdout.strip().splitlines()[-1])
