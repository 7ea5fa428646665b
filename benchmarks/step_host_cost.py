"""Host (CPU) cost of a stage worker's step by the number of running requests, on the tiny model.

A development tool (not part of the package):

    python benchmarks/step_host_cost.py --batches 1 16 64 128 --out /tmp/hostcost.json

The tiny checkpoint's math is cheap, so what a step costs here is mostly the Python around it: the
per-request work of scheduling, building inputs, sampling bookkeeping, reading results back and
routing outputs. The three stages run in this process, each as a real `StageWorker` with
`ShmConnector`s between them (what `worker: process` uses, pickling and all), driven one loop turn
after the other: take the inbox, hand each message to the runner, plan, step, route, publish stats.
For each batch size, `batch` requests start at once and the turns with that many requests in a
decode step are timed (thread CPU time of this, the driving, thread), split into

- ingest: draining the inbox and `accept`ing each message;
- plan: `has_work`, `urgency` and the board (what the loop asks before a step);
- step: `runner.step()`;
- route: putting the step's outputs on the connectors;
- stats: `_publish_stats`.

Code2Wav's decodes are mostly the vocoder's math even on the tiny model; its turns are timed
whether or not they decode (most only take frames in). `--cprofile FILE` writes cProfile stats of
the measured turns of the largest batch; `--count-calls` counts each part's function calls instead
of timing it (a figure the machine's load does not move). Steps are overlapped as on a GPU
(`overlap: true`), and the objects built at start are frozen out of the GC, as in a stage process.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from omnivoice.bench.engine_load import EngineLoadConfig, make_requests
from omnivoice.config import parse_profile
from omnivoice.engine.connectors.shm import ShmConnector
from omnivoice.engine.gc_policy import freeze_built_objects
from omnivoice.engine.stage import StageWorker
from omnivoice.messages import NewRequest
from omnivoice.models.dummy import NEWLINE_ID
from omnivoice.models.tiny import ensure_tiny_checkpoint
from omnivoice.runners.factory import build_runners

STAGES = ("thinker", "talker", "code2wav")
PARTS = ("ingest", "plan", "step", "route", "stats")
SETTLE_S = 0.02


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batches", type=int, nargs="+", default=[1, 16, 64, 128], help="running requests")
    p.add_argument("--steps", type=int, default=30, help="timed decode turns per stage and batch")
    p.add_argument("--warmup", type=int, default=6, help="decode turns before the timed ones")
    p.add_argument("--cache", type=Path, default=None, help="folder of the tiny checkpoint's build")
    p.add_argument(
        "--sampling",
        choices=("greedy", "sampled"),
        default="sampled",
        help="greedy: temperature 0 in both LMs; sampled: the h200 profiles' defaults",
    )
    p.add_argument("--no-cache-key", action="store_true", help="requests without a conversation key")
    p.add_argument("--stages", nargs="+", choices=STAGES, default=list(STAGES), help="stages timed")
    p.add_argument(
        "--count-calls",
        action="store_true",
        help="count the function calls of each part instead of timing it (deterministic, slower)",
    )
    p.add_argument("--cprofile", type=Path, default=None, help="write cProfile stats here")
    p.add_argument("--out", type=Path, default=None, help="write the figures as JSON here")
    p.add_argument("--label", default="", help="free text stored in the JSON")
    return p.parse_args(argv)


def build(batch_max: int, cache: Path | None, sampling: str) -> tuple[Any, dict[str, Any]]:
    folder = cache or Path(tempfile.gettempdir()) / "omnivoice-hostcost"
    checkpoint = ensure_tiny_checkpoint(folder)
    stage = {"device": "cpu", "worker": "thread", "max_batch": batch_max, "max_seq_len": 512, "overlap": True}
    thinker_s = {"temperature": 0.4, "top_p": 0.9, "top_k": 1, "repetition_penalty": 1.05}
    talker_s = {"temperature": 0.9, "top_k": 50, "repetition_penalty": 1.05}
    if sampling == "greedy":
        thinker_s = talker_s = {"temperature": 0.0}
    chunk = {"first_frames": 4, "frames": 25, "left_context": 25, "catch_up": False}
    profile = parse_profile(
        {
            "model": {"path": str(checkpoint), "cache_dir": str(checkpoint.parent)},
            "stages": {
                "thinker": {**stage, "sampling": thinker_s},
                "talker": {**stage, "sampling": talker_s},
                "code2wav": {**stage, "chunk": chunk},
            },
        }
    )
    only = tuple((s, 0) for s in STAGES)
    built = build_runners(profile, checkpoint, only=only)
    return profile, {s: built[(s, 0)] for s in STAGES}


class Meter:
    """What each part of a loop turn costs: thread CPU seconds, or (`calls`) the Python and C function
    calls it makes, a count that does not drift with the machine's load."""

    def __init__(self, calls: bool) -> None:
        self.calls = calls
        self.part = ""
        self.figures: dict[str, float] = {}
        self._since = 0.0

    def switch(self, part: str) -> None:
        now = time.thread_time()
        if self.part and not self.calls:
            self.figures[self.part] += now - self._since
        self.part, self._since = part, time.thread_time()

    def start(self) -> None:
        self.figures = dict.fromkeys(PARTS, 0.0)
        self.part = ""
        if self.calls:
            sys.setprofile(self._count)
        self.switch("ingest")

    def stop(self) -> dict[str, float]:
        self.switch("")
        if self.calls:
            sys.setprofile(None)
        return self.figures

    def _count(self, frame: Any, event: str, arg: Any) -> None:
        if event in ("call", "c_call") and self.part:
            self.figures[self.part] += 1


class Pipeline:
    """The three workers over shared-memory connectors, stepped one loop turn at a time."""

    def __init__(self, runners: dict[str, Any], meter: Meter) -> None:
        self.meter = meter
        self.inboxes = {s: ShmConnector() for s in STAGES}
        self.engine = ShmConnector()
        downstream = {
            "thinker": [self.inboxes["talker"]],
            "talker": [self.inboxes["code2wav"]],
            "code2wav": [],
        }
        self.workers = {
            s: StageWorker(runners[s], self.inboxes[s], downstream[s], self.engine) for s in STAGES
        }

    def turn(self, stage: str, metered: bool) -> tuple[dict[str, float], int, bool]:
        """One loop turn of `stage`'s worker (as `StageWorker._serve` runs it): its parts' figures
        (when `metered`), its decode batch, and whether it stepped."""
        w = self.workers[stage]
        meter = self.meter if metered else Meter(False)
        meter.start()
        for msg in w.inbox.drain():
            w._handle(msg)
        meter.switch("plan")
        stepped, batch = False, 0
        if w.runner.has_work():
            defer = w._plan()
            if defer is not None:
                meter.switch("step")
                outs = w.runner.step(defer)
                meter.switch("route")
                w._route(outs)
                st = w.runner.stats()
                stepped, batch = True, 0 if st.last_step_prefilled else st.last_batch_size
        meter.switch("stats")
        w._publish_stats()
        return meter.stop(), batch, stepped

    def close(self) -> None:
        for c in [*self.inboxes.values(), self.engine]:
            c.close()


def measure(profile: Any, runners: dict[str, Any], batch: int, args: argparse.Namespace) -> dict[str, Any]:
    """Figures of each timed stage with `batch` requests in its decode steps."""
    total = args.warmup + args.steps
    # the thinker runs `total` decode steps at full batch; the talker trails it, one frame per token
    cfg = EngineLoadConfig(
        batch, batch, 0, prompt_tokens=32, text_tokens=total * 3 + 8, audio_frames=total * 3
    )
    requests = make_requests(profile, runners["thinker"].spec, cfg, NEWLINE_ID, batch, f"b{batch}")
    if args.no_cache_key:
        requests = [replace(r, cache_key=None) for r in requests]
    else:
        requests = [replace(r, cache_key=f"conv-{r.request_id}") for r in requests]
    pipe = Pipeline(runners, Meter(args.count_calls))
    for r in requests:
        pipe.inboxes["thinker"].put(NewRequest(r))
    time.sleep(SETTLE_S)
    seen: dict[str, int] = defaultdict(int)
    samples: dict[str, list[dict[str, float]]] = defaultdict(list)
    prof = cProfile.Profile() if args.cprofile is not None else None
    deadline = time.monotonic() + 600
    while not all(seen[s] >= total for s in args.stages) and time.monotonic() < deadline:
        for stage in STAGES:
            timing = stage in args.stages and seen[stage] >= args.warmup and seen[stage] < total
            if prof is not None and timing:
                prof.enable()
            parts, b, stepped = pipe.turn(stage, timing)
            if prof is not None and timing:
                prof.disable()
            # code2wav: every turn while its requests stream counts (most only take frames in)
            counts = b == batch if stage != "code2wav" else len(runners["code2wav"].streams) == batch
            if counts and (stepped or stage == "code2wav"):
                seen[stage] += 1
                if timing:
                    samples[stage].append(parts)
            pipe.engine.drain()
        time.sleep(SETTLE_S)  # what the connectors' feeder threads send arrives
    for r in requests:
        for w in pipe.workers.values():
            w.runner.abort(r.request_id)
    for key in {f"conv-{r.request_id}" for r in requests}:
        runners["thinker"].prefix.drop(key)
    pipe.close()
    if prof is not None and batch == max(args.batches):
        prof.dump_stats(args.cprofile)
    out: dict[str, Any] = {}
    for stage in args.stages:
        rows = samples[stage]
        if not rows:
            out[stage] = None
            continue
        scale = 1.0 if args.count_calls else 1e3
        fig = {p: statistics.median(r[p] for r in rows) * scale for p in PARTS}
        fig["turn"] = statistics.median(sum(r.values()) for r in rows) * scale
        fig["turns"] = len(rows)
        out[stage] = fig
    return out


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(1)
    profile, runners = build(max(args.batches), args.cache, args.sampling)
    freeze_built_objects("step_host_cost")  # as a stage process does once its runner is built
    results: dict[str, Any] = {}
    for batch in args.batches:
        results[str(batch)] = measure(profile, runners, batch, args)
        print(f"batch {batch} done", file=sys.stderr)
    unit = "function calls" if args.count_calls else "thread CPU ms"
    header = f"{'stage':<9} {'batch':>5} " + " ".join(f"{p:>8}" for p in (*PARTS, "turn"))
    header += f"  ({unit}, median of the timed turns)"
    print(header)
    for stage in args.stages:
        for batch in args.batches:
            fig = results[str(batch)][stage]
            if fig is None:
                print(f"{stage:<9} {batch:>5}   (no turn at this batch)")
                continue
            fmt = "8.0f" if args.count_calls else "8.3f"
            cells = " ".join(f"{fig[p]:{fmt}}" for p in (*PARTS, "turn"))
            print(f"{stage:<9} {batch:>5} {cells}")
    if args.out is not None:
        doc = {
            "label": args.label,
            "unit": unit,
            "sampling": args.sampling,
            "steps": args.steps,
            "results": results,
        }
        args.out.write_text(json.dumps(doc, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
