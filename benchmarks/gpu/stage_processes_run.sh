#!/bin/bash
# Issue 27 on the lent H200: the GPU profile with each stage in a process of its own (worker: process,
# each loading only its own part of the weights), against the same profile with thread workers, and a
# stage killed under live sessions. Carry `.whl/` and `.speech/utt.wav` as for serve_run.sh. Results
# in $OUT/r.tgz: per layout (process, thread) serve.log, start.json, gpu-mem.csv (each process's GPU
# memory once ready: with processes, each stage's own part of the weights plus a CUDA context, never
# a copy of the whole model), rt-s<N>.json; then fault/: rt-s<N>.json of the sessions the kill
# ran under, health.log (every /health status change with its time: restarting, then ok: the restart
# time), serve.log.
#   LAYOUTS="process thread"   layouts to measure, in order (fault injection runs on "process" only)
#   SESSIONS="16 32"            session counts per layout (2 turns after 1 warm-up, as serve_run.sh)
#   FAULT_SESSIONS=32           sessions live when the talker process is killed (0: no fault run)
#   KILL_AFTER=20               seconds into that run when the talker process gets SIGKILL
#   MPS=0                       1: start the CUDA MPS daemon first (stage processes then share the GPU
#                               concurrently instead of time-slicing it; compare both)
#   PROFILE=configs/h200-dummy.yaml
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 OMNIVOICE_RUN_DIR=/tmp/ovrun
mkdir -p "$OUT/r"
pack() { (cd "$OUT" && tar czf r.tgz.part r && mv r.tgz.part r.tgz); }
PROFILE=${PROFILE:-configs/h200-dummy.yaml}
URL=http://127.0.0.1:8000
if [ "${MPS:-0}" = 1 ]; then nvidia-cuda-mps-control -d && echo "MPS on" | tee "$OUT/r/mps.txt"; fi

health() { python3 -c 'import json,sys,urllib.request as u
try: print(json.load(u.urlopen(sys.argv[1] + "/health", timeout=2))["status"])
except u.HTTPError as e: print(json.load(e)["status"])
except Exception: print("down")' "$URL"; }

start() {  # $1: profile file, $2: result folder; sets $server
    t0=$(date +%s)
    python3 -m omnivoice serve --profile "$1" --port 8000 > "$2/serve.log" 2>&1 &
    server=$!
    ready=""
    for _ in $(seq 1 ${START_LIMIT:-600}); do
        [ "$(health)" = ok ] && { ready=1; break; }
        kill -0 $server 2>/dev/null || break
        sleep 1
    done
    echo "{\"engine_start_s\": $(( $(date +%s) - t0 )), \"ready\": \"${ready:-no}\"}" > "$2/start.json"
    cat "$2/start.json"
    nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv > "$2/gpu-mem.csv"
    cat "$2/gpu-mem.csv"
    [ -n "$ready" ]
}

sessions() {  # $1: session count, $2: output json
    timeout ${TB:-300} python3 -m omnivoice bench realtime --sessions "$1" --turns ${TURNS:-2} --warmups 1 \
        --ramp-s ${RAMP:-4} --speech-wav .speech/utt.wav --max-output-tokens ${TOKENS:-64} \
        --audio-frames ${FRAMES:-240} --quiet --output-json "$2" > "${2%.json}.log" 2>&1
    tail -14 "${2%.json}.log"
}

for layout in ${LAYOUTS:-process thread}; do
    dir="$OUT/r/$layout"; mkdir -p "$dir"
    profile=/tmp/profile-$layout.yaml
    sed -E "s/^( +worker:) (process|thread)/\1 $layout/" "$PROFILE" > "$profile"
    if ! start "$profile" "$dir"; then tail -40 "$dir/serve.log"; kill $server; pack; continue; fi
    for n in ${SESSIONS:-16 32}; do sessions "$n" "$dir/rt-s$n.json"; pack; done
    if [ "$layout" = process ] && [ "${FAULT_SESSIONS:-32}" != 0 ]; then
        fdir="$OUT/r/fault"; mkdir -p "$fdir"
        sessions "${FAULT_SESSIONS:-32}" "$fdir/rt-s${FAULT_SESSIONS:-32}.json" &
        bench=$!
        sleep ${KILL_AFTER:-20}
        talker=$(python3 -c 'import json,glob
for f in glob.glob("/tmp/ovrun/*.json"):
    for w in json.load(open(f))["workers"]:
        if w["name"].startswith("omnivoice-talker-"): print(w["pid"])' | head -1)
        echo "$(date +%s.%N) kill -9 talker pid $talker" | tee "$fdir/health.log"
        kill -9 "$talker"
        last=""
        for _ in $(seq 1 3000); do  # every 0.1 s, for up to 5 min, until ok again
            s=$(health)
            [ "$s" != "$last" ] && echo "$(date +%s.%N) $s" | tee -a "$fdir/health.log" && last=$s
            [ "$s" = ok ] && [ $(wc -l < "$fdir/health.log") -gt 2 ] && break
            sleep 0.1
        done
        wait $bench
        grep -E "restart|stage worker stopped" "$dir/serve.log" | tail -5 | tee -a "$fdir/health.log"
        pack
    fi
    kill -TERM $server; wait $server
    grep -E "ERROR|Traceback|illegal" "$dir/serve.log" | head -20
    pack
done
if [ "${MPS:-0}" = 1 ]; then echo quit | nvidia-cuda-mps-control; fi
pack && rm -rf "$OUT/r"
