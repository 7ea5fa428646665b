"""Serve the whole app over the tests' fake engine (no model): a server for client-side benchmarks of
the front end alone (transports, sessions, the front door), whose engine answers at once.

    python benchmarks/fake_engine_server.py --url-file /tmp/fake.url &
    python -m omnivoice bench realtime --base-url "$(cat /tmp/fake.url)" --transport twilio ...

It listens on a free loopback port, printed (and written to `--url-file`) once it is up.
The fake engine (tests/support/fake_engine.py) answers each request with `--chunks` audio chunks of
`--chunk-ms` each, `--delay-ms` apart, after a text token each. Everything else is the real app
(`create_app` with the CPU profile's defaults). Needs a source checkout (it imports `tests.support`).
Runs until interrupted (Ctrl-C) or for `--seconds`.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the checkout's tests.support

from tests.support.fake_engine import Script, serve_realtime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--chunks", type=int, default=10, help="audio chunks per answer")
    parser.add_argument("--chunk-ms", type=int, default=100, help="audio per chunk (24 kHz)")
    parser.add_argument("--delay-ms", type=float, default=10.0, help="between the engine's outputs")
    parser.add_argument("--seconds", type=float, default=3600.0, help="serve this long, then stop")
    parser.add_argument("--url-file", type=Path, default=None, help="write the server's URL here")
    args = parser.parse_args()
    script = Script(
        texts=("Hi",) * args.chunks,
        audio_chunks=args.chunks,
        chunk_samples=24 * args.chunk_ms,
        delay=args.delay_ms / 1000,
    )
    with serve_realtime(script) as srv:
        print(f"serving {srv.url} over the fake engine", flush=True)
        if args.url_file is not None:
            args.url_file.write_text(srv.url)
        with contextlib.suppress(KeyboardInterrupt):
            time.sleep(args.seconds)


if __name__ == "__main__":
    main()
