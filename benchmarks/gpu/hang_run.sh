#!/bin/bash
# A wide-batch stall looked for on the lent H200: `bench engine` runs CONC (default "32 1 64") on one
# engine start; when no request has finished for QUIET seconds (default 25) while one is running, every
# thread's Python stack is dumped (SIGUSR1) and nvidia-smi is read, then the run is ended. With
# VARIANT=no-fused-prefill a second engine start runs c=64 with `fused_prefill: false` on both decoders.
# Results under $OUT/r.tgz: sweep logs (stacks at their end), records, nvidia-smi.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
mkdir -p $OUT/r
pack() { (cd $OUT && tar czf r.tgz.part r && mv r.tgz.part r.tgz); }
watch_run() {  # $1: label, $2: profile, $3: concurrencies, $4: requests, $5: warm-ups, $6: time limit
    timeout $6 python3 -m omnivoice bench engine --profile $2 --prompt-tokens 128 --text-tokens 64 \
        --audio-frames 240 --concurrency $3 --num-prompts $4 --warmups $5 --quiet \
        --output-json $OUT/r/$1.json --records $OUT/r/$1.jsonl > $OUT/r/$1.log 2>&1 &
    local pid=$! last=0 quiet=0
    while kill -0 $pid 2>/dev/null; do
        sleep 1
        n=$(cat $OUT/r/$1-c*.jsonl 2>/dev/null | wc -l)
        if [ "$n" != "$last" ]; then last=$n; quiet=0; continue; fi
        grep -q "^engine ready" $OUT/r/$1.log && quiet=$((quiet + 1))
        if [ $quiet -ge ${QUIET:-25} ]; then
            echo "no request finished for $quiet s after $n records: dumping stacks"
            nvidia-smi > $OUT/r/$1-smi.txt 2>&1
            kill -USR1 $pid; sleep 3; kill -9 $pid; break
        fi
    done
    wait $pid
    grep -v "^\[" $OUT/r/$1.log | grep -E "engine ready|requests|TTFP|RTF|audio-s|error|Error" | tail -20
    pack
}
watch_run sweep ${PROFILE:-configs/h200-dummy.yaml} "${CONC:-32 1 64}" "${NUMS:-128 5 256}" "${WARMS:-5 2 5}" ${TS:-400}
if [ "${VARIANT:-}" = no-fused-prefill ]; then
    sed 's/^    max_seq_len: 1024.*/&\n    fused_prefill: false/' ${PROFILE:-configs/h200-dummy.yaml} > /tmp/nofp.yaml
    grep -c "fused_prefill: false" /tmp/nofp.yaml
    watch_run nofp /tmp/nofp.yaml 64 256 5 ${TV:-240}
fi
pack && rm -rf $OUT/r
