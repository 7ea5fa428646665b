#!/bin/bash
# Realtime sessions at scale on the lent H200 (issue 27): 16, 32, 64 and 100 speaking sessions and chat
# at c=32 and c=64 against one server, its /metrics scraped around every run (the event loop's lag,
# each stage's busy / host / runnable / blocked time, GPU utilisation, the measured capacity: `bench
# realtime` puts them in its JSON under runs.*.server). The engine's start costs minutes, so the server
# is started once (setsid nohup, its pid in a file) and each later call reuses it; each call is one
# PHASE that fits a device call (<= 9 minutes), run one after another:
#   PHASE=start   install the wheels, start the server, wait for /health (up to START_LIMIT s, 500)
#                 and then until it lists no `graphs_pending` (up to GRAPHS_LIMIT s, 240: the graphs of
#                 wide batches the stages capture while idle after the start), then scrape /metrics
#                 before any request (the capacity calibrated at start, or the kept calibration)
#   PHASE=wait    wait for /health again (a start that took longer than one call)
#   PHASE=rt      `bench realtime` at each of SESSIONS (default "16 32"; then "64", then "100"; a count
#                 given again runs again: "32 32 32", files rt-s32, rt-s32-2, rt-s32-3), then its
#                 slowest turns with the engine's parts of their wait (benchmarks/slow_turns.py:
#                 slow-s<N>.txt/.json)
#   PHASE=chat    `bench` chat completions at each of CHAT (default "32 64"), text input; INPUT=speech
#                 sends .speech/utt.wav as input_audio instead
#   PHASE=td      semantic_vad against server_vad (benchmarks/turn_detection.py, issue 30) at each of
#                 SESSIONS (default "1 32"); MODES as turn_detection_run.sh's; REPEATS=2 (1 session:
#                 the complete questions only, each session hung up at its answer's first audio)
#   PHASE=fault   `bench realtime` at SESSIONS (default 32; TURNS=8, per-turn lines kept: a turn
#                 refused while the stages restart ends in a few seconds, so a session runs through
#                 about four of them in a restart; the later ones show the answers coming back), and
#                 FAULT_AFTER=45 s into it, once the engine holds FAULT_ACTIVE=8 requests (or 60 s
#                 later), the stage process FAULT_STAGE (talker; core: the engine core's process) is
#                 killed with SIGKILL (as a device fault ends it): fault.json says when, the requests
#                 in the engine then, how long /health was not ok, and the supervisor's "stages
#                 restarted in"; rt-fault-s<N>.json/.log the turns
#   PHASE=stop    SIGTERM the server, keep its log's errors
#   PHASE=engine  after PHASE=stop: `bench engine` (the in-process engine, no server) at each of ENGINE_C
#                 (default 32; 4 x C requests after 8 warm-ups, TOKENS and FRAMES as the chat phase's,
#                 prompts as long as the text chat run's at that concurrency: its mean usage.prompt_tokens,
#                 PROMPT_TOKENS to set it, 128 without one) on PROFILE: the engine's own TTFP beside the
#                 chat phase's through HTTP, on the same machine; engine-c<C>.json/.log
# Like serve_run.sh the device tool carries `.whl/` (the server's wheels) and `.speech/utt.wav` (a
# spoken question made with espeak-ng on the CPU machine); git ignores both, so the call names them in
# its `carry` (PHASE=start stops at once, saying so, when they did not come). Everything measured so far is packed into
# $OUT/r.tgz (r-<name>.tgz for STATE=/tmp/<name>) after every step (a call cut short still returns
# it): serve.log, start.json, metrics-fresh.txt, rt-s<N>.json/.log, chat-<input>-c<C>.json/.log,
# metrics-<step>.txt.
#   TURNS=2 RAMP=6 SPEC=on TOKENS=64 FRAMES=240   as serve_run.sh's; TB=240: one bench's time limit
#   TURN_TIMEOUT=45  a turn unanswered this long fails ('timeout') and the bench goes on, so a stuck
#                 turn is counted, not the whole run lost to TB; each turn's line is in rt-<name>.log
#   CLIENTS=0     the bench's --client-processes (0: one per 32 sessions, at most half the cores)
#   PROF=1        during each rt run, after PROF_AFTER=20 s: the machine's busiest processes and the
#                 server's busiest threads (top), and two `py-spy dump --native` of the server 3 s
#                 apart, in prof-s<N>.txt, then 10 s of `py-spy record` samples of its threads
#                 (collapsed stacks) in record-s<N>.txt (py-spy from .whl/)
#   BUDGET=520    seconds a call may spend; a bench that would not fit in what is left is not started
#   PROFILE=configs/h200-dummy.yaml   (configs/h100-dummy.yaml on an H100: about 40 sessions)
#   MPS=          PHASE=start serves the profile with `stages.mps` set to this (auto, on, off: a copy
#                 of the profile in $STATE); empty: the profile's own (the engine's MPS daemon for the
#                 stage processes that share a GPU, engine/mps.py). PHASE=start writes mps.txt: the
#                 log's MPS line, each worker's omnivoice_stage_mps_client, nvidia-smi's processes
#                 (type M+C: an MPS client) and the MPS processes running; PHASE=stop lists those
#                 still running after the server stopped (none: the engine quit its daemon)
#   FRONT_ENDS=   PHASE=start serves the profile with `server.front_ends` set to this (a copy of the
#                 profile in $STATE, as MPS=): that many front-end processes on the port, sharing the
#                 core; empty: the profile's own
# Example (the lead's device calls, one after another):
#   PHASE=start bash benchmarks/gpu/realtime_scale.sh
#   PHASE=rt SESSIONS="16 32" bash benchmarks/gpu/realtime_scale.sh
#   PHASE=rt SESSIONS=64 bash benchmarks/gpu/realtime_scale.sh
#   PHASE=rt SESSIONS=100 bash benchmarks/gpu/realtime_scale.sh
#   PHASE=chat CHAT="32 64" bash benchmarks/gpu/realtime_scale.sh
#   PHASE=stop bash benchmarks/gpu/realtime_scale.sh
set -u
PHASE=${PHASE:?set PHASE=start|wait|rt|chat|stop}
STATE=${STATE:-/tmp/rtscale}     # survives between calls while the machine stays warm
PROFILE=${PROFILE:-configs/h200-dummy.yaml}
PORT=${PORT:-8000}
URL=http://127.0.0.1:$PORT
TB=${TB:-240}
BUDGET=${BUDGET:-520}
t_call=$(date +%s)
mkdir -p "$STATE/r"
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
# the GPU image has no aiortc or PyAV: the server imports stand-ins there (WebRTC is not served)
python3 -c "import aiortc, av" 2>/dev/null || { mkdir -p /tmp/site && cp -r benchmarks/gpu/stubs/aiortc benchmarks/gpu/stubs/av /tmp/site/; }
# one tarball per STATE (r.tgz for the default, r-<name>.tgz for STATE=/tmp/<name>), so a call that
# drives two servers one after the other brings back both
TGZ=r.tgz; [ "$STATE" != /tmp/rtscale ] && TGZ=r-$(basename "$STATE").tgz
pack() { mkdir -p "$OUT" && (cd "$STATE" && tar czf "$OUT/$TGZ.part" r && mv "$OUT/$TGZ.part" "$OUT/$TGZ"); }
healthy() { python3 -c "import urllib.request as u; u.urlopen('$URL/health', timeout=2)" 2>/dev/null; }
graphs_left() { python3 -c "import urllib.request as u, sys; sys.exit(b'graphs_pending' not in u.urlopen('$URL/health', timeout=2).read())" 2>/dev/null; }
alive() { [ -f "$STATE/server.pid" ] && kill -0 "$(cat "$STATE/server.pid")" 2>/dev/null; }
# $1: a Python expression of `s`, the server's /v1/debug/state, printed
state() { python3 -c "import json, urllib.request as u; s = json.load(u.urlopen('$URL/v1/debug/state', timeout=10)); print($1)"; }
# the run's slowest turns with the engine's parts of their wait, from its JSON and the server's log
slow() {
    python3 benchmarks/slow_turns.py "$STATE/r/rt-$1.json" "$STATE/r/serve.log" --json "$STATE/r/slow-$1.json" \
        > "$STATE/r/slow-$1.txt" 2>&1
    cat "$STATE/r/slow-$1.txt"
}
scrape() { python3 -c "import urllib.request as u; print(u.urlopen('$URL/metrics', timeout=30).read().decode())" > "$STATE/r/metrics-$1.txt" 2>&1; }
left() { echo $(( BUDGET - ($(date +%s) - t_call) )); }
wait_ready() {  # up to $1 seconds
    for _ in $(seq 1 "$1"); do
        if healthy; then return 0; fi
        alive || { echo "the server is not running"; tail -30 "$STATE/r/serve.log"; return 1; }
        sleep 1
    done
    echo "not healthy yet after $1 s (PHASE=wait goes on waiting)"; return 1
}
profile() {  # $1: sessions; what the machine and the server's threads do mid-run
    sleep "${PROF_AFTER:-20}"
    pid=$(cat "$STATE/server.pid")
    # several front ends: the server's pid is their supervisor's; the first front end is sampled
    front=$(state "s['front_ends'][0]['process']['pid'] if s.get('front_ends') else ''" 2>/dev/null)
    [ -n "$front" ] && pid=$front
    {
        echo "== top, processes"; top -b -n 1 -w 220 | head -25
        echo "== top, the server's threads"; top -H -b -n 1 -w 220 -p "$pid" | head -30
        for k in 1 2; do
            echo "== py-spy dump --native, $k"; /tmp/site/bin/py-spy dump --native --pid "$pid" 2>&1
            sleep 3
        done
    } > "$STATE/r/prof-s$1.txt" 2>&1
    # where the server's threads spend their time: 10 s of samples, collapsed stacks per thread
    /tmp/site/bin/py-spy record --pid "$pid" --duration 10 --rate 100 --format raw --threads --nonblocking \
        --output "$STATE/r/record-s$1.txt" > /dev/null 2>&1
}
bench_rt() {  # $1 sessions, $2 turns: issue 27's realtime workload, in rt-$3.json and rt-$3.log
    timeout "$TB" python3 -m omnivoice bench realtime --base-url "$URL" --sessions "$1" --turns "$2" --warmups 1 \
        --speculative "${SPEC:-on}" --ramp-s "${RAMP:-6}" --speech-wav .speech/utt.wav \
        --max-output-tokens "${TOKENS:-64}" --audio-frames "${FRAMES:-240}" \
        --turn-timeout-s "${TURN_TIMEOUT:-45}" --client-processes "${CLIENTS:-0}" \
        --output-json "$STATE/r/rt-$3.json" > "$STATE/r/rt-$3.log" 2>&1
}
ready_or_exit() {
    if ! alive || ! healthy; then echo "no server up: run PHASE=start (or wait) first"; pack; exit 1; fi
}

case "$PHASE" in
start)
    if alive; then echo "a server is already running (pid $(cat "$STATE/server.pid"))"; exit 0; fi
    if ls .whl/*.whl > /dev/null 2>&1; then  # the GPU image lacks the server's dependencies
        python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
    elif ! python3 -c "import pydantic, starlette, uvicorn" 2>/dev/null; then
        echo "the server's dependencies are missing and .whl/ holds no wheels: name .whl and .speech in the device call's carry"
        exit 1
    fi
    [ -f .speech/utt.wav ] || { echo ".speech/utt.wav is missing: name .speech in the device call's carry"; exit 1; }
    date +%s > "$STATE/t0"
    if [ -n "${MPS:-}${FRONT_ENDS:-}" ]; then
        python3 -c "
import sys, yaml
p = yaml.safe_load(open(sys.argv[1]))
if sys.argv[2]: p['stages']['mps'] = sys.argv[2]
if sys.argv[3]: p.setdefault('server', {})['front_ends'] = int(sys.argv[3])
yaml.safe_dump(p, open(sys.argv[4], 'w'))" "$PROFILE" "${MPS:-}" "${FRONT_ENDS:-}" "$STATE/profile.yaml" || exit 1
        PROFILE=$STATE/profile.yaml
    fi
    setsid nohup python3 -m omnivoice serve --profile "$PROFILE" --port "$PORT" > "$STATE/r/serve.log" 2>&1 < /dev/null &
    echo $! > "$STATE/server.pid"
    ;&  # then wait, as PHASE=wait does
wait)
    wait_ready "${START_LIMIT:-$(( $(left) - 10 ))}"; ok=$?
    t_ready=$(( $(date +%s) - $(cat "$STATE/t0") ))
    # the stages capture their wide batches' graphs after the start, while idle: measure with all in place
    t_graphs=null
    [ $ok = 0 ] && for _ in $(seq 1 "${GRAPHS_LIMIT:-240}"); do
        graphs_left || { t_graphs=$(( $(date +%s) - $(cat "$STATE/t0") )); break; }
        sleep 1
    done
    echo "{\"engine_start_s\": $t_ready, \"all_graphs_s\": $t_graphs, \"ready\": $([ $ok = 0 ] && echo true || echo false)}" > "$STATE/r/start.json"
    cat "$STATE/r/start.json"
    if [ $ok = 0 ] && [ ! -f "$STATE/r/metrics-fresh.txt" ]; then
        scrape fresh  # before any request: the capacity comes from the start-up calibration (or a kept one)
        grep -E "^omnivoice_(engine|stage)_capacity_streams|^omnivoice_engine_narrowed" "$STATE/r/metrics-fresh.txt"
        grep -E "capacity calibrated|reusing the calibration|calibrating:|warm-up burst|found GPU memory" "$STATE/r/serve.log" | tail -6
        # each stage's GPU memory as it loaded and once built (a tight card narrows the warm-up burst)
        grep -E "GiB free" "$STATE/r/serve.log" | tail -8
        # whether the stage processes run under the engine's MPS daemon: the log's line, each worker's
        # gauge, and nvidia-smi's process types (M+C: an MPS client)
        {
            grep -E "CUDA MPS|MPS daemon|no CUDA MPS" "$STATE/r/serve.log"
            grep -E "^omnivoice_stage_mps_client" "$STATE/r/metrics-fresh.txt"
            nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv 2>&1
            nvidia-smi | grep -E "M\+C|C  " 2>&1
            ps -eo pid,args | grep -E "nvidia-cuda-mps" | grep -v grep
        } > "$STATE/r/mps.txt" 2>&1
        cat "$STATE/r/mps.txt"
    fi
    pack
    ;;
rt)
    ready_or_exit
    for n in ${SESSIONS:-16 32}; do
        if [ "$(left)" -lt "$TB" ]; then echo "not run (no time left in this call): $n sessions"; continue; fi
        # a count run again (SESSIONS="32 32 32") keeps each run's files: s32, s32-2, s32-3
        name=s$n; k=2
        while [ -e "$STATE/r/rt-$name.json" ] || [ -e "$STATE/r/rt-$name.log" ]; do name=s$n-$k; k=$((k + 1)); done
        [ "${PROF:-0}" = 1 ] && profile "${name#s}" &
        bench_rt "$n" "${TURNS:-2}" "$name"
        wait
        tail -22 "$STATE/r/rt-$name.log"
        slow "$name"
        scrape "$name"
        pack
    done
    ;;
chat)
    ready_or_exit
    input=${INPUT:-text}
    audio=""; [ "$input" = speech ] && audio="--input-audio .speech/utt.wav"
    fixed='{"min_tokens": '${TOKENS:-64}', "min_audio_frames": '${FRAMES:-240}', "max_audio_frames": '${FRAMES:-240}'}'
    for c in ${CHAT:-32 64}; do
        if [ "$(left)" -lt "$TB" ]; then echo "not run (no time left in this call): chat c=$c"; continue; fi
        scrape "chat-$input-c$c-before"
        timeout "$TB" python3 -m omnivoice bench --base-url "$URL" --concurrency "$c" --num-prompts $((c * 2)) --warmups 2 \
            --max-tokens "${TOKENS:-64}" --extra-body "$fixed" $audio --prompt "Answer the question." --quiet \
            --label "$input input, c=$c" --output-json "$STATE/r/chat-$input-c$c.json" > "$STATE/r/chat-$input-c$c.log" 2>&1
        tail -12 "$STATE/r/chat-$input-c$c.log"
        scrape "chat-$input-c$c"
        grep -E "^omnivoice_(event_loop_lag_seconds_(sum|count)|requests_total|stage_(busy|step_blocked)_seconds_total)" "$STATE/r/metrics-chat-$input-c$c.txt"
        pack
    done
    ;;
td)
    ready_or_exit
    modes=${MODES:-server_vad:500,semantic_vad:low,semantic_vad:medium,semantic_vad:high}
    for n in ${SESSIONS:-1 32}; do
        if [ "$(left)" -lt "$TB" ]; then echo "not run (no time left in this call): td $n sessions"; continue; fi
        repeats=$(( (n + 15) / 16 )); one=""
        # one caller at a time: its complete questions only, each hung up at the answer's first audio
        # (nothing is loaded beside it, so waiting out each answer's playback measures nothing more)
        [ "$n" = 1 ] && { repeats=${REPEATS:-2}; one="--hang-up --kinds complete"; }
        timeout "$TB" python3 benchmarks/turn_detection.py --base-url "$URL" --modes "$modes" --sessions "$n" \
            --repeats "$repeats" --max-output-tokens "${TOKENS:-64}" --audio-frames "${FRAMES:-240}" $one \
            --model-threads "${THREADS:-2}" --machine "one H200, its host CPU" \
            --output-json "$STATE/r/td-s$n.json" > "$STATE/r/td-s$n.log" 2>&1
        tail -8 "$STATE/r/td-s$n.log"
        scrape "td-s$n"
        pack
    done
    ;;
fault)
    ready_or_exit
    n=${SESSIONS:-32}
    bench_rt "$n" "${TURNS:-8}" "fault-s$n" &
    bench=$!
    sleep "${FAULT_AFTER:-45}"
    stage=${FAULT_STAGE:-talker}
    # then, up to 60 s more, until the engine holds FAULT_ACTIVE requests, so the kill lands mid-answer
    # (the answers come in waves: a kill timed by the clock alone may land between two)
    for _ in $(seq 1 300); do
        in_flight=$(state "(s['engine'] or {}).get('active_requests', 0)" 2>/dev/null || echo 0)
        [ "$in_flight" -ge "${FAULT_ACTIVE:-8}" ] && break; sleep 0.2
    done
    # FAULT_STAGE=core: the engine core's process (stages.core: process), which takes its stages along
    pid=$(state "s['engine']['core_pid'] if '$stage' == 'core' else [x['pid'] for x in s['engine']['workers'] if x['name'] == '$stage'][0]")
    t_kill=$(date +%s.%N); kill -9 "$pid"
    echo "killed $stage (pid $pid) with $in_flight requests in the engine"
    for _ in $(seq 1 40); do healthy || break; sleep 0.25; done  # until the engine has seen it
    for _ in $(seq 1 480); do healthy && break; sleep 0.25; done
    t_back=$(date +%s.%N)
    restarted=$(grep -oE "(stages|engine core) restarted in [0-9.]* s" "$STATE/r/serve.log" | tail -1)
    echo "{\"stage\": \"$stage\", \"pid\": $pid, \"active_requests_at_kill\": $in_flight, \"health_back_s\": $(python3 -c "print(round($t_back - $t_kill, 1))"), \"log\": \"$restarted\"}" > "$STATE/r/fault.json"
    cat "$STATE/r/fault.json"; pack
    wait $bench
    tail -22 "$STATE/r/rt-fault-s$n.log"
    slow "fault-s$n"
    grep -c "error" "$STATE/r/rt-fault-s$n.log"
    scrape "fault-s$n"
    pack
    ;;
engine)
    # the engine's own figures for the chat workload, on the same machine: the server must be stopped
    # first (both do not fit one GPU), and the stage processes reuse its compiled artifacts
    if alive; then echo "a server is running (pid $(cat "$STATE/server.pid")): PHASE=stop first"; exit 1; fi
    for c in ${ENGINE_C:-32}; do
        if [ "$(left)" -lt "$TB" ]; then echo "not run (no time left in this call): bench engine c=$c"; continue; fi
        # the chat phase's prompt length at this concurrency (its usage.prompt_tokens), so both time
        # the same prefill; PROMPT_TOKENS overrides, 128 without a chat run
        prompt=${PROMPT_TOKENS:-$(python3 -c "import json,sys; print(round(json.load(open(sys.argv[1])).get('mean_prompt_tokens') or 128))" "$STATE/r/chat-text-c$c.json" 2>/dev/null || echo 128)}
        echo "bench engine c=$c with $prompt-token prompts"
        timeout "$TB" python3 -m omnivoice bench engine --profile "$PROFILE" --prompt-tokens "$prompt" \
            --text-tokens "${TOKENS:-64}" --audio-frames "${FRAMES:-240}" --concurrency "$c" \
            --num-prompts $((c * 4)) --warmups 8 --quiet --label "engine, c=$c" \
            --output-json "$STATE/r/engine-c$c.json" > "$STATE/r/engine-c$c.log" 2>&1
        grep -v "^\[" "$STATE/r/engine-c$c.log" | tail -14
        pack
    done
    ;;
stop)
    if alive; then
        pid=$(cat "$STATE/server.pid"); kill -TERM "$pid"
        for _ in $(seq 1 60); do kill -0 "$pid" 2>/dev/null || break; sleep 1; done
    fi
    rm -f "$STATE/server.pid"
    sleep 1
    { echo "MPS processes after the stop:"; ps -eo pid,args | grep -E "nvidia-cuda-mps" | grep -v grep; } \
        >> "$STATE/r/mps.txt" 2>&1
    tail -3 "$STATE/r/mps.txt"
    grep -E "ERROR|Traceback|illegal|slow:|CUDA MPS|MPS daemon" "$STATE/r/serve.log" | head -40
    pack
    ;;
*)
    echo "unknown PHASE=$PHASE"; exit 2
    ;;
esac
