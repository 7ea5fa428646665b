"""`omnivoice bench encoder`: the thinker's audio encoder, one call per utterance against batched.

    omnivoice bench encoder --profile configs/h200-dummy.yaml --seconds 5 10 --batch 1 8 32 \\
        --output-json benchmarks/results/encoder.json

For each utterance length and batch size it times, on the profile's thinker device and dtype:
- `per_utterance`: transformers' audio tower called once per utterance (as each prompt's audio was
  encoded on its own), N calls back to back;
- `packed`: transformers' tower with the N utterances in one call (its own packing);
- `batched`: omnivoice's `AudioEncoder`, the N utterances' windows in one padded forward;
- `batched_graphs` (CUDA only): the same, replayed from a CUDA graph.
Figures are the median over `--repeats` runs after `--warmups`, in ms per batch; `max_abs_diff` is the
largest difference between the batched outputs and the per-utterance ones (they must agree).

Only the audio tower is built: a `dummy:` model's with seeded random weights on the device (seconds,
even at full size), a checkpoint's loaded from its folder (the whole model is read), the tiny default
when the profile names no model.
"""

from __future__ import annotations

import argparse
import shlex
import statistics
import sys
import time
from collections.abc import Callable
from functools import partial
from typing import Any

from omnivoice.bench.report import describe_machine, write_json

_DTYPES = ("float32", "bfloat16", "float16")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of `omnivoice bench encoder` (argparse only: importing this module stays cheap)."""
    a = parser.add_argument
    a("--profile", default=None, metavar="PATH",
      help="deploy profile YAML: its model (a checkpoint, dummy:<name>, default the tiny one) and its "
      "thinker's device and dtype")  # fmt: skip
    a("--device", default=None, help="device to run on (default: the profile's thinker device)")
    a("--dtype", choices=_DTYPES, default=None, help="weights and activations (default: the profile's)")
    a("--seconds", type=float, nargs="+", default=[5.0], metavar="S", help="utterance lengths to time")
    a("--batch", type=int, nargs="+", default=[1, 8, 32], metavar="N", help="utterances per batch")
    a("--repeats", type=int, default=5, help="timed runs of each case (the median is reported)")
    a("--warmups", type=int, default=2, help="untimed runs of each case first")
    a("--seed", type=int, default=0, help="seeds the random log-mel features")
    a("--output-json", default=None, metavar="PATH", help="write the report as JSON here")
    a("--label", default=None, help="free text stored in the report")
    a("--machine", default=None, help="machine description for the report (default: read off this host)")


def _check(args: argparse.Namespace) -> None:
    if min(args.seconds) <= 0.0:
        raise ValueError("--seconds must be > 0")
    if min(args.batch) < 1 or args.repeats < 1 or args.warmups < 0:
        raise ValueError("--batch and --repeats must be >= 1, --warmups >= 0")


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def build_tower(source: Any, device: Any, dtype: Any) -> Any:
    """The audio tower of `source` (a checkpoint folder or a DummySource) on `device` in `dtype` (eval
    mode, no grads)."""
    import torch

    from omnivoice.models.dummy import DummySource, dummy_config

    if isinstance(source, DummySource):
        from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import Qwen3OmniMoeAudioEncoder

        config = dummy_config(source).thinker_config.audio_config  # type: ignore[union-attr]
        with torch.device(device):
            torch.manual_seed(source.seed)
            tower = Qwen3OmniMoeAudioEncoder._from_config(config, dtype=dtype)
    else:
        from omnivoice.models.loader import load_model
        from omnivoice.runners.audio_encoder import audio_tower

        tower = audio_tower(load_model(source, dtype=dtype).model.thinker).to(device)
    return tower.eval().requires_grad_(False)


def _time(fn: Callable[[], Any], sync: Callable[[], None], warmups: int, repeats: int) -> tuple[float, Any]:
    """Median wall time of `fn` in ms (device work included), and its last result."""
    out = None
    for _ in range(warmups):
        out = fn()
    sync()
    times = []
    for _ in range(repeats):
        began = time.perf_counter()
        out = fn()
        sync()
        times.append(1000 * (time.perf_counter() - began))
    return statistics.median(times), out


def _case(tower: Any, encoders: dict[str, Any], mels: list[Any], args: argparse.Namespace) -> dict[str, Any]:
    """One (length, batch) case: every mode timed, and the batched outputs checked against the tower's."""
    import torch

    device = next(tower.parameters()).device
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    lengths = torch.tensor([m.shape[1] for m in mels], device=device)
    on_device = [m.to(device, tower.conv2d1.weight.dtype) for m in mels]
    packed = torch.cat(on_device, dim=1)  # [n_mels, total frames]: the tower's packed input

    def per_utterance() -> list[Any]:
        return [tower(m, feature_lens=lengths[i : i + 1]).last_hidden_state for i, m in enumerate(on_device)]

    row: dict[str, Any] = {}
    with torch.inference_mode():
        row["per_utterance_ms"], reference = _time(per_utterance, sync, args.warmups, args.repeats)
        row["packed_ms"], _ = _time(
            lambda: tower(packed, feature_lens=lengths).last_hidden_state, sync, args.warmups, args.repeats
        )
        diff = 0.0
        for name, encoder in encoders.items():
            row[f"{name}_ms"], outs = _time(
                partial(encoder.encode_clips, mels), sync, args.warmups, args.repeats
            )
            gaps = ((o.float() - r.float()).abs().max().item() for o, r in zip(outs, reference, strict=True))
            diff = max([diff, *gaps])
    row["max_abs_diff"] = diff
    return {k: round(v, 3) if isinstance(v, float) else v for k, v in row.items()}


def run(args: argparse.Namespace) -> int:
    """Run the benchmark; 0 when every case ran, 2 on bad options."""
    from omnivoice.config import ProfileError, load_profile, parse_profile

    try:
        _check(args)
        profile = load_profile(args.profile) if args.profile else parse_profile({})
    except (ValueError, ProfileError) as e:
        print(f"omnivoice bench encoder: {e}", file=sys.stderr)
        return 2
    import torch
    import transformers

    from omnivoice.engine.loading import resolve_model_path
    from omnivoice.runners.audio_encoder import AudioEncoder

    thinker = profile.stages.thinker
    device = torch.device(args.device or thinker.device)
    dtype = getattr(torch, args.dtype or thinker.dtype)
    _say(f"building the audio tower on {device} ({dtype})")
    source = resolve_model_path(profile)
    tower = build_tower(source, device, dtype)
    probe = AudioEncoder(tower, device, max_windows=1)
    most = max(args.batch) * -(-round(max(args.seconds) * 100) // probe.window)  # windows of the largest case
    encoders = {"batched": AudioEncoder(tower, device, max_windows=most)}
    if device.type == "cuda":
        encoders["batched_graphs"] = AudioEncoder(tower, device, max_windows=most, graphs=True)
    g = torch.Generator().manual_seed(args.seed)
    results = []
    for seconds in args.seconds:
        for n in args.batch:
            _say(f"{n} utterance(s) of {seconds:g} s ...")
            mels = [torch.randn(probe.n_mels, round(seconds * 100), generator=g) for _ in range(n)]
            row = {"seconds": seconds, "batch": n, **_case(tower, encoders, mels, args)}
            results.append(row)
            _say(
                "  "
                + ", ".join(f"{k} {v}" for k, v in row.items() if k.endswith("_ms") or k == "max_abs_diff")
            )
    report = {
        "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "label": args.label,
        "machine": args.machine or describe_machine(),
        "model": str(source),
        "device": str(device),
        "dtype": str(dtype).removeprefix("torch."),
        "command": shlex.join(["omnivoice", *sys.argv[1:]]),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "warmups": args.warmups,
        "repeats": args.repeats,
        "results": results,
    }
    print(_table(results))
    if args.output_json:
        write_json(report, args.output_json)
        _say(f"wrote {args.output_json}")
    return 0


def _table(results: list[dict[str, Any]]) -> str:
    modes = [k for k in results[0] if k.endswith("_ms")] if results else []
    head = f"{'seconds':>8}{'batch':>7}" + "".join(f"{m.removesuffix('_ms'):>16}" for m in modes)
    lines = ["ms per batch (median):", head + f"{'max diff':>12}"]
    for r in results:
        cells = "".join(f"{r[m]:>16.1f}" for m in modes)
        lines.append(f"{r['seconds']:>8g}{r['batch']:>7}{cells}{r['max_abs_diff']:>12.2e}")
    return "\n".join(lines)
