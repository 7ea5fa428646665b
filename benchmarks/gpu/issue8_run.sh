#!/bin/bash
# Issue 8's GPU figures in one command on the lent H200 (the `device` tool runs it in a copy of the
# working tree, with the pydantic wheels of `.whl/` carried along; results go under $OUT as r.tgz):
#   the CUDA sampling-graph check, c=32 and c=1 on one engine start (`bench engine` sweep), then,
#   with PARITY=1, graphed-vs-eager parity, and with PROF=1, the per-stage step profiles; PARTS=1
#   first times one full-size layer's prefill parts (benchmarks/prefill_parts.py); KERN=1 first runs
#   the code predictor kernels' CUDA tests and times a frame (benchmarks/predictor_frame.py); TINY=1
#   first runs the tiny checkpoint's parity (configs/cuda-tiny.yaml); SWEEP=0 skips the sweep;
#   BASELINE=1 measures transformers' generate() (2 requests at batch 1) in the sweep's run, before the
#   engine starts; GEMMS=1 also times each predictor GEMM alone and TORCH_SAMPLING=1 a frame with torch sampling (with KERN=1).
# TS / TPA / TP / TT: time limits in seconds of the sweep, parity, profile and tiny parity.
# CONC / NUMS / WARMS: the sweep's concurrencies, request counts and warm-ups (default "32 1",
# "128 5", "5 2"); PROFILE: the profile (default configs/h200-dummy.yaml); WIDE=1 first runs the
# GPU tests of graphs replayed side by side and of every stage at its widest bucket; RESTART=1 starts
# the engine once more after the sweep (c=1, 2 requests: the start with compile caches on disk).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD
mkdir -p $OUT/r
python3 -m pytest -q -o addopts="" -p no:cacheprovider tests/runners/test_slot_sampling.py -k cuda_graph || exit 1
PROFILE=${PROFILE:-configs/h200-dummy.yaml}
pack() { (cd $OUT && tar czf r.tgz.part r && mv r.tgz.part r.tgz); }
if [ -n "${WIDE:-}" ]; then
( time timeout ${TW:-240} python3 -m pytest -q -o addopts="" -p no:cacheprovider tests/runners/test_graphs_side_by_side.py \
    tests/engine/test_wide_batches_cuda.py ) > $OUT/r/wide-tests.log 2>&1
tail -5 $OUT/r/wide-tests.log; pack
fi
if [ -n "${PARTS:-}" ]; then  # one full-size layer's prefill parts: ~1 minute
python3 benchmarks/prefill_parts.py --rows 1 32 --tokens 140 --out $OUT/r/prefill-parts.json > $OUT/r/parts.log 2>&1
tail -3 $OUT/r/parts.log
fi
if [ -n "${KERN:-}" ]; then  # ~1-2 minutes
if [ -z "${KERN_NO_TESTS:-}" ]; then
python3 -m pytest -q -o addopts="" -p no:cacheprovider tests/runners/test_predictor_kernels.py tests/runners/test_residual_code_kernel.py > $OUT/r/kern-tests.log 2>&1
tail -3 $OUT/r/kern-tests.log
fi
python3 benchmarks/predictor_frame.py --batch 1 8 32 --tiles ${TILES:-32x128x4x4} ${GEMMS:+--gemms} ${TORCH_SAMPLING:+--torch-sampling} --profile-out $OUT/r/kern-prof --out $OUT/r/predictor-frame.json > $OUT/r/kern.log 2>&1
grep -v "^20" $OUT/r/kern.log | tail -8
fi
if [ -n "${TINY:-}" ]; then
( time timeout ${TT:-200} python3 -m omnivoice bench parity --profile configs/cuda-tiny.yaml --requests 5 \
    --text-tokens 32 --audio-frames 64 --output-json $OUT/r/tiny-parity.json ) > $OUT/r/tiny-parity.log 2>&1
tail -8 $OUT/r/tiny-parity.log
fi
if [ "${SWEEP:-1}" != 0 ]; then
( time timeout ${TS:-300} python3 -m omnivoice bench engine --profile $PROFILE --prompt-tokens 128 \
    --text-tokens 64 --audio-frames 240 --concurrency ${CONC:-32 1} --num-prompts ${NUMS:-128 5} --warmups ${WARMS:-5 2} \
    --output-json $OUT/r/sweep.json --records $OUT/r/sweep.jsonl --quiet \
    ${BASELINE:+--baseline transformers --baseline-requests 2} ) > $OUT/r/sweep.log 2>&1
grep -v "^\[" $OUT/r/sweep.log | tail -45; pack
fi
if [ -n "${RESTART:-}" ]; then
( time timeout ${TR:-200} python3 -m omnivoice bench engine --profile $PROFILE --prompt-tokens 128 \
    --text-tokens 64 --audio-frames 240 --concurrency 1 --num-prompts 2 --warmups 1 \
    --output-json $OUT/r/restart.json --quiet ) > $OUT/r/restart.log 2>&1
grep -v "^\[" $OUT/r/restart.log | tail -12; pack
fi
if [ -n "${PARITY:-}" ]; then
( time timeout ${TPA:-200} python3 -m omnivoice bench parity --profile configs/h200-dummy.yaml --requests 4 --prompt-tokens 128 \
    --text-tokens 64 --audio-frames 120 --output-json $OUT/r/parity.json ) > $OUT/r/parity.log 2>&1
tail -8 $OUT/r/parity.log
fi
if [ -n "${PROF:-}" ]; then
( time timeout ${TP:-250} python3 benchmarks/profile_steps.py --profile configs/h200-dummy.yaml --batch 32 --out $OUT/r/prof ) > $OUT/r/prof.log 2>&1
tail -5 $OUT/r/prof.log
fi
pack && rm -rf $OUT/r
