#!/bin/bash
# The realtime front door alone (issue 27, part 4) on the H200 host's 16 cores: `omnivoice bench
# front-door` (no server, no GPU work), the per-session path and then the batched front door, at each
# session count. Run with the `device` tool over a copy of the working tree with `.whl/` carried along,
# as serve_run.sh (espeak-ng must be on the machine; else pass SPEECH_WAV=path/to.wav, e.g. one of
# benchmarks/turn_clips). Results under $OUT/r.tgz: fd-<mode>.json and .log.
#   MODES="per-session batched"  which paths to run, in order (one per call keeps a call short)
#   SESSIONS=8,32,64,100   session counts, one run each
#   SECONDS_EACH=20        audio each session sends per run
#   WORKERS=2 BATCH_MS=3   server.audio_workers and server.audio_batch_ms of the batched runs
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
mkdir -p "$OUT/r"
pack() { (cd "$OUT" && tar czf r.tgz.part r && mv r.tgz.part r.tgz); }
speech=()
[ -n "${SPEECH_WAV:-}" ] && speech=(--speech-wav "$SPEECH_WAV")
common=(--sessions "${SESSIONS:-8,32,64,100}" --seconds "${SECONDS_EACH:-20}" --quiet "${speech[@]}")
for mode in ${MODES:-per-session batched}; do
    if [ "$mode" = per-session ]; then args=(--per-session); else args=(--workers "${WORKERS:-2}" --batch-ms "${BATCH_MS:-3}"); fi
    timeout ${TB:-280} python3 -m omnivoice bench front-door "${common[@]}" "${args[@]}" \
        --label "H200 host, $mode" --output-json "$OUT/r/fd-$mode.json" > "$OUT/r/fd-$mode.log" 2>&1
    tail -8 "$OUT/r/fd-$mode.log"
    pack
done
