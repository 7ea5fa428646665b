"""`omnivoice` command line: argument parsing and wiring only.

omnivoice serve [--profile PATH] [--host H] [--port P] [--log-level L] [--insecure-no-auth]
omnivoice bench ...                 (load benchmark; options from omnivoice.bench.cli)
omnivoice bench engine ...          (in-process engine benchmark; options from omnivoice.bench.engine_cli)
omnivoice bench parity ...          (CUDA-graphed vs eager: identical greedy outputs)
omnivoice bench encoder ...         (the audio encoder, per utterance vs batched; omnivoice.bench.encoder_cli)
omnivoice bench realtime ...        (spoken /v1/realtime sessions; options from omnivoice.bench.realtime_cli)
omnivoice bench soak ...            (a long realtime run with barge-ins and abrupt disconnects, then a
                                     leak check; options from omnivoice.bench.soak_cli)
omnivoice bench front-door ...      (the realtime front door alone: VAD, log-mel and decoding of N
                                     sessions, batched or per session; omnivoice.bench.front_door_cli)
omnivoice bench ab REV_A REV_B ...  (two git revisions served alternately, one workload, ratios B/A;
                                     options from omnivoice.bench.ab_cli)
omnivoice profile check PATH
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import logging
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from omnivoice.config import Profile, ProfileError, load_profile
from omnivoice.logs import configure_logging, stacks_on_sigusr1

if TYPE_CHECKING:
    from omnivoice.engine.core.launch import CoreLaunch

log = logging.getLogger("omnivoice")

LOG_LEVELS = ("debug", "info", "warning", "error")
EXIT_USAGE = 2


def build_parser(
    with_bench: bool = False,
    with_realtime: bool = False,
    with_soak: bool = False,
    with_ab: bool = False,
    with_front_door: bool = False,
) -> argparse.ArgumentParser:
    """The full parser; the options of `bench` (HTTP) and `bench realtime` are added only when asked for
    (their imports are lazy and need packages the engine alone does not)."""
    parser = argparse.ArgumentParser(
        prog="omnivoice",
        description="Real-time voice backend serving Qwen3-Omni thinker-talker models as a staged engine.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    serve = sub.add_parser(
        "serve",
        help="run the HTTP server (OpenAI-compatible /v1/chat/completions with streamed audio)",
        description="Load the model and serve /v1/chat/completions, /v1/realtime (WebSocket, WebRTC), "
        "telephony, /v1/models, /health and /metrics. Settings come from the profile; "
        "--host/--port/--log-level override it. Authentication: every API route needs "
        "'Authorization: Bearer <key>' with a key from the OMNIVOICE_API_KEY environment variable "
        "(comma-separated for several) or the profile's auth.api_key_file. With no key configured the "
        "server is open and listens on loopback only: a non-loopback --host is refused unless "
        "--insecure-no-auth is given.",
    )
    serve.add_argument(
        "--profile", metavar="PATH", help="deploy profile YAML (default: built-in CPU profile)"
    )
    serve.add_argument("--host", help="interface to bind (default: the profile's server.host)")
    serve.add_argument(
        "--port", type=int, help="TCP port, 0 for any free one (default: the profile's server.port)"
    )
    serve.add_argument("--log-level", choices=LOG_LEVELS, help="default: the profile's server.log_level")
    serve.add_argument(
        "--insecure-no-auth",
        action="store_true",
        help="with no API key configured, serve a non-loopback --host anyway (anyone who reaches it can "
        "use it; same as auth.allow_unauthenticated_remote)",
    )
    serve.set_defaults(func=_serve)

    bench = sub.add_parser(
        "bench",
        help="load-test a running server and report TTFT, time to first audio, RTF and throughput",
        description="Closed-loop streaming load against a running server's /v1/chat/completions.",
    )
    if with_bench:
        from omnivoice.bench.cli import add_arguments

        add_arguments(bench)
    bench.set_defaults(func=_bench)
    modes = bench.add_subparsers(dest="bench_mode", metavar="MODE")
    engine = modes.add_parser(
        "engine",
        help="drive the staged engine in-process (no server) with token-id prompts of fixed lengths",
        description="Closed-loop load on an in-process engine (Engine -> stages -> runners), with "
        "vLLM-Omni's metric definitions; optionally transformers' generate() as the baseline.",
    )
    from omnivoice.bench.engine_cli import add_arguments as add_engine_arguments  # argparse only

    add_engine_arguments(engine)
    engine.set_defaults(func=_bench_engine)
    parity = modes.add_parser(
        "parity",
        help="check that CUDA-graphed and eager execution give identical greedy tokens, codes and audio",
        description="Runs the same greedy requests through the thinker, talker and code2wav runners with "
        "their CUDA graphs off and on (one fixed step order) and compares text tokens, codec frames and "
        "PCM exactly (PCM within --pcm-atol); exits 1 on any difference.",
    )
    from omnivoice.bench.parity import add_arguments as add_parity_arguments  # argparse only

    add_parity_arguments(parity)
    parity.set_defaults(func=_bench_parity)
    encoder = modes.add_parser(
        "encoder",
        help="time the thinker's audio encoder: one call per utterance against batched windows",
        description="Builds the model's audio encoder on the profile's thinker device and times "
        "utterances of each --seconds in batches of each --batch: transformers' tower one call per "
        "utterance and packed, and omnivoice's batched encoder (with CUDA graphs on a GPU); prints a table "
        "and writes JSON.",
    )
    from omnivoice.bench.encoder_cli import add_arguments as add_encoder_arguments  # argparse only

    add_encoder_arguments(encoder)
    encoder.set_defaults(func=_bench_encoder)
    realtime = modes.add_parser(
        "realtime",
        help="concurrent spoken sessions against /v1/realtime: voice-to-voice latency and output gaps",
        description="N sessions stream speech at real-time pace (server VAD ends each turn); reports "
        "voice-to-voice latency p50/p95 and playback stalls of the returned audio.",
    )
    if with_realtime:  # its module needs soxr and websockets, which the GPU image lacks
        from omnivoice.bench.realtime_cli import add_arguments as add_realtime_arguments

        add_realtime_arguments(realtime)
    realtime.set_defaults(func=_bench_realtime)
    front_door = modes.add_parser(
        "front-door",
        help="the realtime front door alone: N sessions' appends decoded and scored (VAD, log-mel)",
        description="N sessions send speech in 20 ms appends at real-time pace, decoded, resampled and "
        "scored by the server's front door (no network, no engine): batched by its worker threads, or "
        "each append alone with --per-session. Reports CPU seconds per audio second per session, each "
        "append's lag behind real time and the turns heard; prints a table and writes JSON.",
    )
    if with_front_door:  # its module needs soxr, onnxruntime and torch
        from omnivoice.bench.front_door_cli import add_arguments as add_front_door_arguments

        add_front_door_arguments(front_door)
    front_door.set_defaults(func=_bench_front_door)
    soak = modes.add_parser(
        "soak",
        help="a long realtime run (turns, barge-ins, abrupt disconnects), then a check that nothing leaked",
        description="Callers talk to /v1/realtime over and over: normal turns, barge-ins and abrupt TCP "
        "disconnects at random points. Samples the server's /v1/debug/state (loopback) during the run and "
        "reports sessions, turns, errors, latency drift and memory; exits 1 when anything leaked.",
    )
    if with_soak:  # needs soxr and websockets, as bench realtime
        from omnivoice.bench.soak_cli import add_arguments as add_soak_arguments

        add_soak_arguments(soak)
    soak.set_defaults(func=_bench_soak)
    ab = modes.add_parser(
        "ab",
        help="serve two git revisions alternately, run one workload against each, print ratios B/A",
        description="Unpacks REV_A and REV_B into temporary trees, serves each in turn (one server up at "
        "a time) and runs the chat or realtime workload against it --runs times; prints the ratio of "
        "means B/A of latency and time to first audio with a bootstrap interval and writes JSON. With "
        "--fail-above it is a `git bisect run` script.",
    )
    if with_ab:  # its module needs httpx, as bench itself
        from omnivoice.bench.ab_cli import add_arguments as add_ab_arguments

        add_ab_arguments(ab)
    ab.set_defaults(func=_bench_ab)

    profile = sub.add_parser("profile", help="work with deploy profiles", description="Deploy profile tools.")
    profile_sub = profile.add_subparsers(dest="profile_command", required=True, metavar="ACTION")
    check = profile_sub.add_parser(
        "check",
        help="validate a profile file",
        description="Validate a profile: print every problem naming its key and exit 2, or print 'ok'.",
    )
    check.add_argument("path", metavar="PATH", help="profile YAML to validate")
    check.set_defaults(func=_profile_check)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    positional = [a for a in args_list if not a.startswith("-")]
    # the HTTP client's options (and httpx) only for `bench` itself, not for `bench engine`
    with_bench = positional[:1] == ["bench"] and positional[1:2] not in (
        ["engine"],
        ["parity"],
        ["encoder"],
        ["realtime"],
        ["soak"],
        ["ab"],
        ["front-door"],
    )
    try:
        parser = build_parser(
            with_bench=with_bench,
            with_realtime=positional[:2] == ["bench", "realtime"],
            with_soak=positional[:2] == ["bench", "soak"],
            with_ab=positional[:2] == ["bench", "ab"],
            with_front_door=positional[:2] == ["bench", "front-door"],
        )
    except ImportError as e:
        print(f"omnivoice bench is not available: {e}", file=sys.stderr)
        return EXIT_USAGE
    client_args: list[str] = []
    if positional[:2] == ["bench", "ab"] and "--" in args_list:  # the rest is the workload client's
        cut = args_list.index("--")
        args_list, client_args = args_list[:cut], args_list[cut + 1 :]
    args = parser.parse_args(args_list)
    if client_args:
        args.client_args = client_args
    stacks_on_sigusr1()
    return args.func(args)


def _serve(args: argparse.Namespace) -> int:
    try:
        profile = load_profile(args.profile)
    except ProfileError as e:
        print(e, file=sys.stderr)
        return EXIT_USAGE
    host = args.host or profile.server.host
    port = profile.server.port if args.port is None else args.port
    level = args.log_level or profile.server.log_level
    from omnivoice.server.auth.keys import ApiKeys, KeyConfigError, UnsafeBind, check_bind
    from omnivoice.server.auth.redact import redact_logs

    try:  # before anything is logged or loaded: a server open to the network without a key never starts
        keys = ApiKeys.load(profile.auth)
        check_bind(host, keys, profile.auth, args.insecure_no_auth)
    except (KeyConfigError, UnsafeBind) as e:
        print(f"omnivoice serve: {e}", file=sys.stderr)
        return EXIT_USAGE
    configure_logging(level)
    if profile.server.front_ends > 1:  # a supervisor of the core and the front-end processes
        from omnivoice.server.front_ends.supervisor import serve_fleet

        redact_logs(keys.secrets())
        return serve_fleet(profile, host, port, level, keys)
    launch = _launch_core(profile)  # its start runs beside the server's imports and start
    from omnivoice.server.app import run_server  # the server stack, imported only for `serve`
    from omnivoice.server.lifecycle import start_default_engine

    factory = functools.partial(start_default_engine, launch=launch)
    try:
        return asyncio.run(
            run_server(
                profile, host, port, level, factory, api_keys=keys, insecure_no_auth=args.insecure_no_auth
            )
        )
    except KeyboardInterrupt:
        return 130
    finally:
        if launch is not None:
            launch.close()  # only if the server never took it over


def _launch_core(profile: Profile) -> CoreLaunch | None:
    """The engine core of a `stages.core: process` profile that names its model, started now, before
    the server imports its own stack; None otherwise (the server starts the engine as it starts; the
    tiny default may have to be built first, and a model that cannot be resolved is reported then)."""
    if profile.stages.core != "process" or profile.model.path is None:
        return None
    from omnivoice.engine.core.launch import CoreLaunch

    try:
        return CoreLaunch.begin(profile)
    except (OSError, ValueError):
        return None


def _bench(args: argparse.Namespace) -> int:
    from omnivoice.bench.cli import run

    configure_logging("info")
    return run(args)


def _bench_engine(args: argparse.Namespace) -> int:
    from omnivoice.bench.engine_cli import run

    configure_logging("info")
    return run(args)


def _bench_parity(args: argparse.Namespace) -> int:
    from omnivoice.bench.parity import run

    configure_logging("info")
    return run(args)


def _bench_encoder(args: argparse.Namespace) -> int:
    from omnivoice.bench.encoder_cli import run

    configure_logging("info")
    return run(args)


def _bench_realtime(args: argparse.Namespace) -> int:
    from omnivoice.bench.realtime_cli import run

    configure_logging("info")
    return run(args)


def _bench_front_door(args: argparse.Namespace) -> int:
    from omnivoice.bench.front_door_cli import run

    configure_logging("info")
    return run(args)


def _bench_soak(args: argparse.Namespace) -> int:
    from omnivoice.bench.soak_cli import run

    configure_logging("info")
    return run(args)


def _bench_ab(args: argparse.Namespace) -> int:
    from omnivoice.bench.ab_cli import run

    configure_logging("info")
    return run(args)


def _profile_check(args: argparse.Namespace) -> int:
    try:
        load_profile(args.path)
    except ProfileError as e:
        print(e, file=sys.stderr)
        return EXIT_USAGE
    print(f"{args.path}: ok")
    return 0
