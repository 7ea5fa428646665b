#!/bin/bash
# semantic_vad against server_vad on the lent H200 (issue 30): the real server, driven by
# benchmarks/turn_detection.py (the espeak-ng clips of benchmarks/turn_clips, in the repo) from the
# same machine. Run with the `device` tool over a copy of the working tree with `.whl/` carried along,
# as serve_run.sh: the server's wheels, which must now include pipecat-ai's (it ships the end-of-turn
# model; installed --no-deps, only its ONNX file is read). Results under $OUT/r.tgz: serve.log,
# td-s<N>.json and .log per session count, /metrics after each. Every step packs what is there.
#   SESSIONS="1 32"   clips run at once (32: the 16 clips twice, all together)
#   MODES=...         default server_vad:500 and semantic_vad low, medium, high
#   TOKENS=64 FRAMES=240 each answer's text tokens and audio frames
#   PROFILE=configs/h200-dummy.yaml  the served profile
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
mkdir -p "$OUT/r"
pack() { (cd "$OUT" && tar czf r.tgz.part r && mv r.tgz.part r.tgz); }
PROFILE=${PROFILE:-configs/h200-dummy.yaml}
python3 -m omnivoice serve --profile "$PROFILE" --port 8000 > "$OUT/r/serve.log" 2>&1 &
server=$!
ready=""
for _ in $(seq 1 ${START_LIMIT:-300}); do
    if python3 -c 'import urllib.request as u; u.urlopen("http://127.0.0.1:8000/health", timeout=2)' 2>/dev/null; then ready=1; break; fi
    kill -0 $server 2>/dev/null || break
    sleep 1
done
if [ -z "$ready" ]; then tail -30 "$OUT/r/serve.log"; kill $server; pack; exit 1; fi
modes=${MODES:-server_vad:500,semantic_vad:low,semantic_vad:medium,semantic_vad:high}
for n in ${SESSIONS:-1 32}; do
    repeats=$(( (n + 15) / 16 )); [ "$n" = 1 ] && repeats=2
    timeout ${TB:-500} python3 benchmarks/turn_detection.py --base-url http://127.0.0.1:8000 --modes "$modes" \
        --sessions "$n" --repeats "$repeats" --max-output-tokens ${TOKENS:-64} --audio-frames ${FRAMES:-240} \
        --model-threads ${THREADS:-2} --machine "one H200, its host CPU" --quiet \
        --output-json "$OUT/r/td-s$n.json" > "$OUT/r/td-s$n.log" 2>&1
    tail -8 "$OUT/r/td-s$n.log"
    python3 -c 'import urllib.request as u; print(u.urlopen("http://127.0.0.1:8000/metrics").read().decode())' > "$OUT/r/metrics-s$n.txt"
    pack
done
kill $server
wait $server
pack
