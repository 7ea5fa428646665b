#!/bin/bash
# Engine start on the lent H200 (issue 28): `omnivoice serve` timed from the command to `engine ready`,
# on a fresh machine (cold: no compiler caches, no kept artifacts) and again on the same machine (warm),
# each followed by a quick chat check through HTTP (c=32 and c=1, the issue-8 lengths) to show that
# nothing got slower. One phase per call, so each fits the device's 10-minute limit; the machine keeps
# ~/.cache/omnivoice (kept compiled artifacts, inductor's cache, start times) between calls made
# within 30 s of each other:
#   PHASE=cold bash benchmarks/gpu/start_run.sh    # clears the caches first
#   PHASE=warm bash benchmarks/gpu/start_run.sh    # right after: the restart with caches on disk
#   PHASE=c2w  bash benchmarks/gpu/start_run.sh    # Code2Wav's warm-up under each cuDNN tuning setting
# Once healthy, it waits until /health lists no `graphs_pending` (the CUDA graphs of wide batches that
# the stages capture after the start, while idle: `graphs_at_start`) before the chat runs, so these
# measure the stages with every graph in place.
# Results in $OUT/r-<phase>.tgz (one per phase, so one call can run both), packed after every step: serve-<phase>.log, start-<phase>.json (engine_start_s,
# all_graphs_s: from the command until no graph was pending, start_caches, gpu, per-step seconds from
# the log), health-<phase>.jsonl (/health while starting, every 5th poll), chat-<phase>-c<N>.json, and
# for c2w code2wav-start.json. Python runs unbuffered.
#   PROFILE=configs/h200-dummy.yaml  PORT=8000  START_LIMIT=480 (s)  CHAT="32 1"  TB=150 (s per chat run)
#   TOKENS=64 FRAMES=240  MODES="1:10 1:3 16:10 65:0" (c2w: tune_from_batch:benchmark_limit)
#   SPY=1   sample every process of the server (py-spy from .whl/, --subprocesses) from the command
#           until healthy: collapsed stacks in spy-<phase>.txt, where each stage's start spends its time
#   KEEP=1  leave the server running for realtime_scale.sh's later phases (its pid and log where that
#           script keeps them, under STATE=/tmp/rtscale) instead of stopping it after the chat runs
set -u
if [ -d .whl ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
fi
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
# the GPU image has no aiortc or PyAV: the server imports stand-ins there (WebRTC is not served)
python3 -c "import aiortc, av" 2>/dev/null || { mkdir -p /tmp/site && cp -r benchmarks/gpu/stubs/aiortc benchmarks/gpu/stubs/av /tmp/site/; }
PHASE=${PHASE:-cold}
PROFILE=${PROFILE:-configs/h200-dummy.yaml}
PORT=${PORT:-8000}
mkdir -p "$OUT/r"
STATE=${STATE:-/tmp/rtscale}
log="$OUT/r/serve-$PHASE.log"
if [ "${KEEP:-0}" = 1 ]; then mkdir -p "$STATE/r"; log="$STATE/r/serve.log"; fi  # $OUT is emptied by the next call
pack() { [ "${KEEP:-0}" = 1 ] && cp "$log" "$OUT/r/serve-$PHASE.log"; (cd "$OUT" && tar czf "r-$PHASE.tgz.part" r && mv "r-$PHASE.tgz.part" "r-$PHASE.tgz"); }
health() { python3 -c 'import urllib.request as u, sys
try: print(u.urlopen(f"http://127.0.0.1:{sys.argv[1]}/health", timeout=2).read().decode())
except Exception as e: print(e.read().decode() if hasattr(e, "read") else "{}"); sys.exit(1)' $PORT; }
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1); gpu=${gpu:-cpu}

if [ "$PHASE" = c2w ]; then
    ( time timeout ${TC:-540} python3 benchmarks/code2wav_start.py --max-batch 64 --modes ${MODES:-1:10 1:3 16:10 65:0} \
        --out "$OUT/r/code2wav-start.json" ) > "$OUT/r/code2wav-start.log" 2>&1
    grep -v "^\[" "$OUT/r/code2wav-start.log" | tail -14
    pack && rm -rf "$OUT/r"; exit 0
fi
if [ "$PHASE" = cold ]; then  # a fresh machine: nothing compiled, kept or timed before
    rm -rf ~/.cache/omnivoice/compiled ~/.cache/omnivoice/starts /tmp/torchinductor_* ~/.triton/cache
fi
t0=$(date +%s.%N)
setsid nohup python3 -m omnivoice serve --profile "$PROFILE" --port $PORT > "$log" 2>&1 < /dev/null &
server=$!
spy=""
if [ "${SPY:-0}" = 1 ]; then
    /tmp/site/bin/py-spy record --pid $server --subprocesses --rate ${SPY_RATE:-25} --threads --idle --format raw --nonblocking \
        -o "$OUT/r/spy-$PHASE.txt" > "$OUT/r/spy-$PHASE.log" 2>&1 &
    spy=$!
fi
if [ "${KEEP:-0}" = 1 ]; then echo $server > "$STATE/server.pid"; echo "${t0%.*}" > "$STATE/t0"; fi
ready=""
for i in $(seq 1 ${START_LIMIT:-480}); do
    body=$(health) && { ready=1; break; }
    [ $((i % 5)) = 1 ] && echo "{\"t\": $(( $(date +%s) - ${t0%.*} )), \"health\": $body}" >> "$OUT/r/health-$PHASE.jsonl"
    kill -0 $server 2>/dev/null || break
    sleep 1
done
t1=$(date +%s.%N)
if [ -n "$spy" ]; then  # py-spy writes its samples on SIGINT
    kill -INT $spy; for _ in $(seq 1 30); do kill -0 $spy 2>/dev/null || break; sleep 1; done
fi
t2=""  # until no stage has graphs left to capture
for i in $(seq 1 ${GRAPHS_LIMIT:-240}); do
    [ -n "$ready" ] || break
    body=$(health)
    echo "$body" | grep -q graphs_pending || { t2=$(date +%s.%N); break; }
    [ $((i % 5)) = 1 ] && echo "{\"t\": $(( $(date +%s) - ${t0%.*} )), \"health\": $body}" >> "$OUT/r/health-$PHASE.jsonl"
    sleep 1
done
python3 - "$log" "$PHASE" "$gpu" "$t0" "$t1" "${ready:-}" "$t2" > "$OUT/r/start-$PHASE.json" <<'EOF'
import json, re, sys, torch
log, phase, gpu, t0, t1, ready, t2 = sys.argv[1:8]
text = open(log, errors="replace").read()
steps = {m[1]: float(m[2]) for m in re.finditer(r"start: (\S+ [^.\n]+?) done in ([\d.]+) s", text)}
ready_in = re.search(r"engine ready in ([\d.]+) s", text)
print(json.dumps({
    "engine_start_s": round(float(t1) - float(t0), 1), "ready": bool(ready), "start_caches": phase,
    "all_graphs_s": round(float(t2) - float(t0), 1) if t2 else None,
    "graphs_left_for_later": re.findall(r"\d+ of wider batches left for when the stage is idle", text),
    "graphs_captured_after": re.findall(r"the \d+ CUDA graphs left for after the start are captured[^\n]*", text),
    "engine_ready_log_s": float(ready_in[1]) if ready_in else None, "gpu": gpu, "torch": torch.__version__,
    "reused_compiled": len(re.findall(r"compiled artifacts reused", text)),
    "compile_cache": re.findall(r"compile cache: \d+ graphs reused, \d+ compiled", text),
    "capacity": re.findall(r"(?:capacity calibrated|reusing the calibration|calibrating:)[^\n]*", text),
    "code2wav": re.findall(r"code2wav: \d+ CUDA graphs captured in [\d.]+ s", text),
    "steps_s": steps,
}, indent=1))
EOF
cat "$OUT/r/start-$PHASE.json"; pack
if [ -z "$ready" ]; then tail -30 "$log"; kill $server; pack; exit 1; fi
fixed='{"min_tokens": '${TOKENS:-64}', "min_audio_frames": '${FRAMES:-240}', "max_audio_frames": '${FRAMES:-240}'}'
for c in ${CHAT:-32 1}; do
    n=$((c * 2)); [ "$c" = 1 ] && n=3
    timeout ${TB:-150} python3 -m omnivoice bench --base-url http://127.0.0.1:$PORT --concurrency "$c" --num-prompts $n --warmups 2 \
        --max-tokens ${TOKENS:-64} --extra-body "$fixed" --prompt "Answer the question." --quiet \
        --label "$PHASE start, c=$c" --output-json "$OUT/r/chat-$PHASE-c$c.json" > "$OUT/r/chat-$PHASE-c$c.log" 2>&1
    tail -12 "$OUT/r/chat-$PHASE-c$c.log"; pack
done
grep -E "ERROR|Traceback|WARNING .*corrupt" "$log" | head -20
if [ "${KEEP:-0}" = 1 ]; then echo "the server stays up (pid $server)"; pack && rm -rf "$OUT/r"; exit 0; fi
kill -TERM $server
for _ in $(seq 1 60); do kill -0 $server 2>/dev/null || break; sleep 1; done
kill -0 $server 2>/dev/null && kill -9 $server
pack && rm -rf "$OUT/r"
