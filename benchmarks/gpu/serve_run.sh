#!/bin/bash
# The real server on the lent H200, driven by speaking sessions from the same machine (issue 19).
# The `device` tool runs it over a copy of the working tree with `.whl/` (the server's wheels: the GPU
# image has no starlette, uvicorn, soxr, aiortc...) and `.speech/utt.wav` (a spoken question made on
# the CPU machine with espeak-ng; the GPU machine has no synthesizer) carried along. Results under
# $OUT/r.tgz (the device tool returns few files): serve.log, start.json (engine start seconds),
# rt-s<N>.json per session count, chat-*.json, /metrics after each session count. Every step packs what
# is there so far, so a run cut by its time limit still returns what it measured.
#   SESSIONS="1 32"      session counts, one `bench realtime` each (3-6 s speech, server VAD)
#   TURNS=2 RAMP=4       turns per session; seconds over which the sessions' starts are spread
#   SPEC1=both SPEC=on   speculative responses on and off for one session, on (the default) for more
#   TOKENS=64 FRAMES=240 each answer's text tokens and audio frames
#   CHAT="32"            chat concurrencies, each run with the same speech as input_audio and as text only
#   TWILIO="32"          session counts run again as Twilio calls (u-law 8 kHz), after the realtime ones
#   PROFILE=configs/h200-dummy.yaml  the served profile
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
mkdir -p "$OUT/r"
pack() { (cd "$OUT" && tar czf r.tgz.part r && mv r.tgz.part r.tgz); }
PROFILE=${PROFILE:-configs/h200-dummy.yaml}
t0=$(date +%s)
python3 -m omnivoice serve --profile "$PROFILE" --port 8000 > "$OUT/r/serve.log" 2>&1 &
server=$!
ready=""
for _ in $(seq 1 ${START_LIMIT:-300}); do
    if python3 -c 'import urllib.request as u; u.urlopen("http://127.0.0.1:8000/health", timeout=2)' 2>/dev/null; then ready=1; break; fi
    kill -0 $server 2>/dev/null || break
    sleep 1
done
echo "{\"engine_start_s\": $(( $(date +%s) - t0 )), \"ready\": \"${ready:-no}\"}" > "$OUT/r/start.json"
cat "$OUT/r/start.json"
if [ -z "$ready" ]; then tail -30 "$OUT/r/serve.log"; kill $server; pack; exit 1; fi
fixed='{"min_tokens": '${TOKENS:-64}', "min_audio_frames": '${FRAMES:-240}', "max_audio_frames": '${FRAMES:-240}'}'
for c in ${CHAT:-}; do
    for input in speech text; do
        audio=""; [ $input = speech ] && audio="--input-audio .speech/utt.wav"
        timeout ${TB:-200} python3 -m omnivoice bench --concurrency "$c" --num-prompts $((c * 2)) --warmups 2 \
            --max-tokens ${TOKENS:-64} --extra-body "$fixed" $audio --prompt "Answer the question." --quiet \
            --label "$input input, c=$c" --output-json "$OUT/r/chat-$input-c$c.json" > "$OUT/r/chat-$input-c$c.log" 2>&1
        tail -12 "$OUT/r/chat-$input-c$c.log"
        pack
    done
done
for n in ${SESSIONS:-1 32}; do
    spec=${SPEC:-on}; [ "$n" = 1 ] && spec=${SPEC1:-both}
    timeout ${TB:-200} python3 -m omnivoice bench realtime --sessions "$n" --turns ${TURNS:-2} --warmups 1 --speculative $spec \
        --ramp-s ${RAMP:-4} --speech-wav .speech/utt.wav --max-output-tokens ${TOKENS:-64} \
        --audio-frames ${FRAMES:-240} --quiet --output-json "$OUT/r/rt-s$n.json" > "$OUT/r/rt-s$n.log" 2>&1
    tail -14 "$OUT/r/rt-s$n.log"
    python3 -c 'import urllib.request as u; print(u.urlopen("http://127.0.0.1:8000/metrics").read().decode())' > "$OUT/r/metrics-s$n.txt"
    pack
done
for n in ${TWILIO:-}; do
    timeout ${TB:-200} python3 -m omnivoice bench realtime --transport twilio --sessions "$n" --turns ${TURNS:-2} \
        --warmups 1 --speculative ${SPEC:-on} --ramp-s ${RAMP:-4} --speech-wav .speech/utt.wav \
        --max-output-tokens ${TOKENS:-64} --audio-frames ${FRAMES:-240} --quiet \
        --output-json "$OUT/r/twilio-s$n.json" > "$OUT/r/twilio-s$n.log" 2>&1
    tail -14 "$OUT/r/twilio-s$n.log"
    pack
done
python3 -c 'import urllib.request as u; print(u.urlopen("http://127.0.0.1:8000/metrics").read().decode())' > "$OUT/r/metrics.txt"
kill -TERM $server; wait $server
grep -E "ERROR|Traceback|illegal" "$OUT/r/serve.log" | head -20
pack && rm -rf "$OUT/r"
