"""`omnivoice bench`: closed-loop chat-completions load against a running server, then a report."""

from __future__ import annotations

import argparse
import asyncio
import json
import shlex
import sys
from pathlib import Path

import httpx

from omnivoice.bench.chat_load import LoadConfig, LoadResult, run_load
from omnivoice.bench.metrics import RequestRecord, playback_stall, rtf, summarize
from omnivoice.bench.report import build_report, describe_machine, format_table, write_json
from omnivoice.bench.server_metrics import breakdown, format_lines

DEFAULT_PROMPT = "Tell me a short story about a lighthouse keeper and a lost seagull."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of `omnivoice bench`."""
    a = parser.add_argument
    a("--base-url", default="http://127.0.0.1:8000", help="server root (without /v1)")
    a("--model", default=None, help="model name to send (default: the first of GET /v1/models)")
    a("--num-prompts", type=int, default=16, help="measured requests")
    a("--concurrency", type=int, default=1, help="requests in flight at once (closed loop)")
    a("--warmups", type=int, default=1, help="requests sent first and left out of the figures")
    a("--max-tokens", type=int, default=128, help="max_tokens of each request")
    a("--modalities", default="text,audio", help="comma-separated output modalities")
    a("--voice", default="ethan", help="audio.voice of each request")
    a("--audio-format", default="pcm16", help="audio.format of each request (pcm16 or wav)")
    src = parser.add_mutually_exclusive_group()
    src.add_argument("--prompt", default=None, help="the user message of every request")
    src.add_argument("--prompt-file", type=Path, default=None, help="one prompt per line, used in turn")
    a(
        "--input-audio",
        type=Path,
        default=None,
        help="a WAV file sent with every request as an input_audio part before the prompt's text "
        "(spoken input, as a voice client sends it)",
    )
    a("--api-key", default=None, help="sent as 'Authorization: Bearer KEY'")
    a("--seed", type=int, default=None, help="sent as the request seed; also shuffles the prompt order")
    a("--temperature", type=float, default=None, help="sampling temperature (default: the server's)")
    a("--no-usage", action="store_true", help="don't ask for the usage chunk; count text chunks as tokens")
    a(
        "--extra-body",
        type=_json_object,
        default={},
        help="JSON object merged into every request body, e.g. fixed lengths on omnivoice: "
        '\'{"min_tokens": 32, "min_audio_frames": 119, "max_audio_frames": 119}\'',
    )
    a("--timeout", type=float, default=600.0, help="seconds one request may take")
    a("--output-json", type=Path, default=None, help="write the report as JSON here")
    a("--label", default=None, help="free text stored in the report")
    a("--engine", default=None, help="engine name for the report (default: owned_by of the model)")
    a("--machine", default=None, help="machine description for the report (default: read off this host)")
    a("--quiet", action="store_true", help="no line per completed request on stderr")


def _json_object(text: str) -> dict:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"not valid JSON: {e}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("must be a JSON object")
    return value


def _prompts(args: argparse.Namespace) -> tuple[str, ...]:
    if args.prompt_file is not None:
        lines = [ln.strip() for ln in args.prompt_file.read_text().splitlines()]
        return tuple(ln for ln in lines if ln)
    return (args.prompt or DEFAULT_PROMPT,)


def _input_audio(path: Path | None) -> bytes | None:
    if path is None:
        return None
    data = path.read_bytes()
    if data[:4] != b"RIFF" or data[8:12] != b"WAVE":
        raise ValueError(f"--input-audio {path} is not a WAV file")
    return data


def _config(args: argparse.Namespace) -> LoadConfig:
    modalities = tuple(m.strip() for m in args.modalities.split(",") if m.strip())
    if not set(modalities) <= {"text", "audio"} or not modalities:
        raise ValueError(f"--modalities must be text, audio or both, not {args.modalities!r}")
    for name in ("num_prompts", "concurrency", "max_tokens"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1")
    if args.warmups < 0:
        raise ValueError("--warmups must be >= 0")
    prompts = _prompts(args)
    if not prompts:
        raise ValueError(f"no prompts in {args.prompt_file}")
    return LoadConfig(
        base_url=args.base_url.rstrip("/"),
        prompts=prompts,
        model=args.model,
        num_prompts=args.num_prompts,
        concurrency=args.concurrency,
        warmups=args.warmups,
        max_tokens=args.max_tokens,
        modalities=modalities,
        voice=args.voice,
        audio_format=args.audio_format,
        include_usage=not args.no_usage,
        api_key=args.api_key,
        seed=args.seed,
        temperature=args.temperature,
        timeout_s=args.timeout,
        extra_body=args.extra_body,
        input_audio=_input_audio(args.input_audio),
    )


def _progress_line(phase: str, done: int, total: int, r: RequestRecord) -> str:
    head = f"[{phase} {done:>{len(str(total))}}/{total}]"
    if r.error is not None:
        return f"{head} error: {r.error}"
    parts = []
    if r.first_text is not None:
        parts.append(f"ttft {1000 * (r.first_text - r.t0):.0f} ms")
    if r.first_audio is not None:
        parts.append(f"ttfp {1000 * (r.first_audio - r.t0):.0f} ms")
        parts.append(f"audio {r.audio_seconds:.2f} s")
        parts.append(f"rtf {rtf(r) or 0.0:.2f}")
        parts.append(f"stall {1000 * playback_stall(r.audio_chunks):.0f} ms")
    parts.append(f"{r.text_tokens} tok")
    return f"{head} " + ", ".join(parts)


def run(args: argparse.Namespace) -> int:
    """Run the benchmark; 0 if at least one measured request succeeded, 1 if none did, 2 on bad options."""
    try:
        cfg = _config(args)
    except (ValueError, OSError) as e:
        print(f"omnivoice bench: {e}", file=sys.stderr)
        return 2

    def progress(phase: str, done: int, total: int, record: RequestRecord) -> None:
        if not args.quiet:
            print(_progress_line(phase, done, total, record), file=sys.stderr, flush=True)

    print(
        f"benchmarking {cfg.base_url}: {cfg.num_prompts} requests (+{cfg.warmups} warm-up) "
        f"at concurrency {cfg.concurrency}",
        file=sys.stderr,
    )
    try:
        result: LoadResult = asyncio.run(run_load(cfg, progress))
    except (httpx.HTTPError, ValueError) as e:
        print(f"omnivoice bench: cannot start: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    summary = summarize(result.records, result.duration_s)
    report = build_report(
        summary,
        label=args.label,
        engine=args.engine or result.owned_by or "unknown",
        machine=args.machine or describe_machine(),
        model=result.model,
        base_url=cfg.base_url,
        concurrency=cfg.concurrency,
        warmups=cfg.warmups,
        max_tokens=cfg.max_tokens,
        modalities=",".join(cfg.modalities),
        command=shlex.join([Path(sys.argv[0]).name, *sys.argv[1:]]),
    )
    server = breakdown(*result.scraped, result.duration_s)
    if server is not None:
        report["server"] = server
    print(format_table(report))
    if server is not None:
        print("\n".join(format_lines(server)))
    if args.output_json is not None:
        write_json(report, args.output_json)
        print(f"wrote {args.output_json}", file=sys.stderr)
    return 0 if summary.requests > 0 else 1
