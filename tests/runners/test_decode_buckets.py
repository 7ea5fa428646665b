"""Fixed-shape decode steps: buckets, padding rows on the scratch KV slot, and CUDA graphs on a GPU.

On the CPU steps run at their exact size; padding is what the GPU path does (and what its graphs
replay), so the CPU tests switch it on and check that it changes no token and no codec frame.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch

from omnivoice.bench.engine_load import EngineLoadConfig, make_requests
from omnivoice.bench.parity import compare, drive, graph_steps
from omnivoice.config import ProfileError, parse_profile
from omnivoice.models.dummy import NEWLINE_ID
from omnivoice.runners import fused_layers
from omnivoice.runners.factory import build_runners
from omnivoice.runners.fused_layers import CompiledFn, decode_layer
from omnivoice.runners.graphs import batch_buckets, bucket, kv_buckets


def test_buckets_cover_every_size_up_to_the_limit() -> None:
    assert batch_buckets(32) == (1, 2, 4, 8, 16, 24, 32)
    assert batch_buckets(5) == (1, 2, 4, 5)
    assert batch_buckets(1) == (1,)
    assert kv_buckets(512) == (128, 256, 512)
    assert kv_buckets(300) == (128, 256, 300)
    assert kv_buckets(100) == (100,)
    for n in range(1, 33):
        assert n <= bucket(n, batch_buckets(32)) < 2 * n + 8
    with pytest.raises(ValueError, match="exceeds the largest bucket"):
        bucket(33, batch_buckets(32))


def test_cuda_graph_execution_needs_a_cuda_device() -> None:
    with pytest.raises(ProfileError, match="cuda_graph needs CUDA devices"):
        parse_profile({"stages": {"talker": {"execution": "cuda_graph"}}})
    with pytest.raises(ProfileError, match=r"stages\.code2wav: .*cuda_graph needs CUDA devices, not cpu"):
        parse_profile({"stages": {"code2wav": {"execution": "cuda_graph"}}})
    for stage in ("talker", "code2wav"):
        ok = parse_profile({"stages": {stage: {"device": "cuda:0", "execution": "cuda_graph"}}})
        assert ok.stages.stage(stage).execution == "cuda_graph"


def _profile(checkpoint: Path, device: str, execution: str, dtype: str = "float32"):
    stage = {"device": device, "execution": execution, "worker": "thread", "max_batch": 8, "max_seq_len": 512}
    stage["dtype"] = dtype
    return parse_profile(
        {
            "model": {"path": str(checkpoint)},
            "stages": {
                "thinker": {**stage, "sampling": {"temperature": 0.0}},
                "talker": {**stage, "sampling": {"temperature": 0.0}},
            },
        }
    )


def _requests(profile, spec, n: int, frames: int = 12):
    cfg = EngineLoadConfig(n, n, 0, prompt_tokens=24, text_tokens=10, audio_frames=frames)
    return make_requests(profile, spec, cfg, NEWLINE_ID, n, "bucket")


def test_padded_steps_give_the_same_tokens_and_frames_as_exact_ones(tiny_checkpoint: Path) -> None:
    """Five requests pad to a batch of 8 (three rows on the scratch slot) and to a KV length of 128."""
    profile = _profile(tiny_checkpoint, "cpu", "eager")
    runners = build_runners(profile, tiny_checkpoint, only=(("thinker", 0), ("talker", 0)))
    thinker, talker = runners[("thinker", 0)], runners[("talker", 0)]
    requests = _requests(profile, thinker.spec, 5)
    exact = drive(thinker, talker, requests)
    assert thinker.decode_step.rows(5) == 5
    thinker.decode_step.pad = talker.decode_step.pad = True
    assert thinker.decode_step.rows(5) == 8
    padded = drive(thinker, talker, requests)
    result = compare(exact, padded)
    assert result["identical"], result
    assert all(r["tokens"] == 10 and r["frames"] == 12 for r in result["requests"])
    # every slot is back, and the scratch slot was never handed out
    assert thinker.cache.free_slots == thinker.cache.k.shape[1] - 1


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA device")
def test_cuda_graphs_give_the_same_greedy_tokens_and_frames_as_eager(tiny_checkpoint: Path) -> None:
    profile = _profile(tiny_checkpoint, "cuda:0", "cuda_graph")
    runners = build_runners(profile, tiny_checkpoint, only=(("thinker", 0), ("talker", 0)))
    thinker, talker = runners[("thinker", 0)], runners[("talker", 0)]
    requests = _requests(profile, thinker.spec, 5, frames=40)
    steps = graph_steps(thinker) + graph_steps(talker)
    assert all(s.captured for s in steps)  # captured at build
    for s in steps:
        s.enabled = False
    eager = drive(thinker, talker, requests)
    for s in steps:
        s.enabled = True
    graphed = drive(thinker, talker, requests)
    result = compare(eager, graphed)
    assert result["identical"], result


def _stacks(runners) -> dict[str, tuple]:
    stacks = {}
    if ("thinker", 0) in runners:
        thinker = runners[("thinker", 0)]
        stacks["thinker"] = (thinker.stack, thinker.cache)
    if ("talker", 0) in runners:
        talker = runners[("talker", 0)]
        stacks["talker"] = (talker.stack, talker.cache)
        stacks["code predictor"] = (talker.predictor.stack, talker.predictor.cache)
    return stacks


@pytest.mark.parametrize("rows,tokens", [(1, 1), (3, 1), (2, 2)])
def test_fused_decode_layers_match_transformers_modules(
    tiny_checkpoint: Path, rows: int, tokens: int
) -> None:
    """The GPU's fused layer math (`fused_layers`: own attention, MoE routing over grouped GEMMs, the
    talker's shared expert), run eagerly on the CPU, against the layers' own transformers modules."""
    profile = _profile(tiny_checkpoint, "cpu", "eager")
    runners = build_runners(profile, tiny_checkpoint, only=(("thinker", 0), ("talker", 0)))
    gen = torch.Generator().manual_seed(0)
    for name, (stack, cache) in _stacks(runners).items():
        hidden = stack.layers[0].input_layernorm.weight.shape[0]
        h = torch.randn(rows, tokens, hidden, generator=gen)
        slot_idx = torch.arange(rows)
        start_idx = torch.tensor([5, 0, 9][:rows])  # rows at different positions of their slots
        keep = (1, len(stack.layers))
        with torch.inference_mode():
            for layer in stack.layers:  # weights of unit gain, so every part visibly moves the output
                for param in layer.parameters():
                    if param.dim() > 1:
                        param.normal_(0.0, param.shape[-1] ** -0.5, generator=gen)
                    else:
                        param.uniform_(0.5, 1.5, generator=gen)
            cache.k.normal_(generator=gen)  # earlier positions hold keys the step attends to
            cache.v.normal_(generator=gen)
            ref, ref_kept = stack.forward_indexed(h, cache, slot_idx, start_idx, 16, keep)
            stack.fuse()
            assert stack._fused and all(w is not None for w in stack._fused), name
            out, kept = stack.forward_indexed(h, cache, slot_idx, start_idx, 16, keep)
        torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-4, msg=name)
        for k in keep:
            torch.testing.assert_close(kept[k], ref_kept[k], rtol=1e-4, atol=1e-4, msg=name)


@pytest.mark.parametrize("starts", [(0, 0), (4, 0)])
def test_a_batched_prefill_equals_each_row_alone(tiny_checkpoint: Path, starts: tuple[int, int]) -> None:
    """Prompts right-padded to one length and prefilled together (with and without a cached prefix
    before one row) give each row's real positions what the row alone gives."""
    profile = _profile(tiny_checkpoint, "cpu", "eager")
    runners = build_runners(profile, tiny_checkpoint, only=(("thinker", 0), ("talker", 0)))
    gen = torch.Generator().manual_seed(2)
    lengths = [6, 4]
    for name, (stack, cache) in _stacks(runners).items():
        hidden = stack.layers[0].input_layernorm.weight.shape[0]
        h = torch.randn(2, 6, hidden, generator=gen)
        with torch.inference_mode():
            cache.k.normal_(generator=gen)  # the cached prefix of a row that starts later
            cache.v.normal_(generator=gen)
            batched, _ = stack.forward(h, cache, [0, 1], list(starts), lengths=lengths)
            alone = [
                stack.forward(h[b : b + 1, :n], cache, [b], [starts[b]])[0][0] for b, n in enumerate(lengths)
            ]
        for b, n in enumerate(lengths):
            torch.testing.assert_close(batched[b, :n], alone[b], rtol=1e-4, atol=1e-4, msg=name)


def test_a_fused_prefill_gives_what_transformers_modules_give(tiny_checkpoint: Path) -> None:
    """The GPU's prefill through the fused layers (`DecoderStack.prefill`), run eagerly on the CPU, of
    right-padded prompts (one after a cached prefix) against the layers' transformers modules: the
    outputs and kept hidden states at every real position, the keys and values written, the slots'
    lengths. The MoE groups a prompt's pairs by a sort, however few they are."""
    profile = _profile(tiny_checkpoint, "cpu", "eager")
    runners = build_runners(profile, tiny_checkpoint, only=(("thinker", 0), ("talker", 0)))
    gen = torch.Generator().manual_seed(3)
    lengths, starts = [6, 4], [4, 0]
    for name, (stack, cache) in _stacks(runners).items():
        if name == "code predictor":
            continue
        hidden = stack.layers[0].input_layernorm.weight.shape[0]
        h = torch.randn(2, 6, hidden, generator=gen)
        keep = (0, 1, len(stack.layers))
        with torch.inference_mode():
            cache.k.normal_(generator=gen)  # the cached prefix of the row that starts later
            cache.v.normal_(generator=gen)
            prefix = (cache.k.clone(), cache.v.clone())
            ref, ref_kept = stack.forward(h, cache, [0, 1], starts, keep, lengths)
            ref_cache, ref_lengths = (cache.k.clone(), cache.v.clone()), list(cache.lengths)
            cache.k.copy_(prefix[0])
            cache.v.copy_(prefix[1])
            cache.lengths[:] = [0] * len(cache.lengths)
            stack.fuse(prefill=True)
            out, kept = stack.prefill(h, cache, [0, 1], starts, keep, lengths)
        assert cache.lengths == ref_lengths, name
        for b, (n, start) in enumerate(zip(lengths, starts, strict=True)):
            torch.testing.assert_close(out[b, :n], ref[b, :n], rtol=1e-4, atol=1e-4, msg=name)
            for k in keep:
                torch.testing.assert_close(kept[k][b, :n], ref_kept[k][b, :n], rtol=1e-4, atol=1e-4, msg=name)
            for got, want in zip((cache.k, cache.v), ref_cache, strict=True):
                real = slice(0, start + n)  # the prefix and the prompt; padding may write past them
                torch.testing.assert_close(got[:, b, :, real], want[:, b, :, real], rtol=1e-4, atol=1e-4)


def test_a_one_row_fused_prefill_runs_as_two_rows_as_the_modules_give(
    tiny_checkpoint: Path,
) -> None:
    """A one-row prompt batch gets a padding row in the scratch slot (one compiled kind serves every
    batch size): its own outputs, keys and values are the modules', and no other slot is written."""
    profile = _profile(tiny_checkpoint, "cpu", "eager")
    runners = build_runners(profile, tiny_checkpoint, only=(("thinker", 0),))
    stack, cache = runners[("thinker", 0)].stack, runners[("thinker", 0)].cache
    hidden = stack.layers[0].input_layernorm.weight.shape[0]
    h = torch.randn(1, 5, hidden, generator=torch.Generator().manual_seed(5))
    keep = (0, len(stack.layers))
    with torch.inference_mode():
        before = (cache.k.clone(), cache.v.clone())
        ref, ref_kept = stack.forward(h, cache, [2], [0], keep)
        ref_cache = (cache.k.clone(), cache.v.clone())
        cache.k.copy_(before[0])
        cache.v.copy_(before[1])
        cache.lengths[:] = [0] * len(cache.lengths)
        stack.fuse(prefill=True)
        out, kept = stack.prefill(h, cache, [2], [0], keep)
    assert out.shape == ref.shape and cache.lengths[2] == 5
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-4)
    for k in keep:
        torch.testing.assert_close(kept[k], ref_kept[k], rtol=1e-4, atol=1e-4)
    for got, want, old in zip((cache.k, cache.v), ref_cache, before, strict=True):
        torch.testing.assert_close(got[:, 2, :, :5], want[:, 2, :, :5], rtol=1e-4, atol=1e-4)
        others = [i for i in range(got.shape[1]) if i not in (2, cache.scratch)]
        assert torch.equal(got[:, others], old[:, others])  # only its slot and the scratch slot written


def test_a_prefill_past_the_cache_length_is_refused_not_written_out_of_bounds(tiny_checkpoint: Path) -> None:
    """Padded rows must fit the cache for the fused prefill (an index past it would be a device-side
    fault on a GPU); a batch that does not goes the modules' way, which refuses it with a clear error."""
    profile = _profile(tiny_checkpoint, "cpu", "eager")
    runners = build_runners(profile, tiny_checkpoint, only=(("thinker", 0),))
    stack, cache = _stacks(runners)["thinker"]
    stack.fuse(prefill=True)
    hidden = stack.layers[0].input_layernorm.weight.shape[0]
    h = torch.randn(2, 8, hidden)
    starts = [cache.max_len - 8, 0]  # row 0 ends exactly at the cache's end: fits
    with torch.inference_mode():
        stack.prefill(h, cache, [0, 1], starts, lengths=[8, 8])
        assert cache.lengths[:2] == [cache.max_len, 8]
        with pytest.raises(RuntimeError, match="exceeds the KV cache length"):  # one position more
            stack.prefill(h, cache, [0, 1], [cache.max_len - 7, 0], lengths=[7, 8])


def _step(stack, cache, h: torch.Tensor) -> torch.Tensor:
    rows = h.shape[0]
    out, _ = stack.forward_indexed(h, cache, torch.arange(rows), torch.tensor([5, 0, 9][:rows]), 16)
    return out


@pytest.mark.parametrize(
    "name,sort_above", [("thinker", None), ("talker", None), ("code predictor", None), ("thinker", 0)]
)
def test_compiled_decode_layers_match_the_plain_ones(
    tiny_checkpoint: Path, name: str, sort_above: int | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """torch.compile of the fused layer (inductor's C++ backend on the CPU, in bf16 as on a GPU):
    the whole layer compiles as one graph (no eager fallback) and computes what the plain one does,
    also with the MoE's sort-based grouping of a step past SCAN_PAIRS (sort_above=0)."""
    if sort_above is not None:
        monkeypatch.setattr(fused_layers, "SCAN_PAIRS", sort_above)
    profile = _profile(tiny_checkpoint, "cpu", "eager", "bfloat16")
    runners = build_runners(profile, tiny_checkpoint, only=(("thinker", 0), ("talker", 0)))
    stack, cache = _stacks(runners)[name]
    hidden = stack.layers[0].input_layernorm.weight.shape[0]
    h = torch.randn(3, 1, hidden, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    with torch.inference_mode():
        stack.fuse()
        plain, plain_cache = _step(stack, cache, h), cache.k.clone()
        stack._layer = CompiledFn(decode_layer, "decode layers")
        cache.k.zero_()
        compiled = _step(stack, cache, h)
    assert stack._layer.compiled, "the compiled layer fell back to eager"
    torch.testing.assert_close(compiled.float(), plain.float(), rtol=0.05, atol=0.05)
    torch.testing.assert_close(cache.k, plain_cache, rtol=0.05, atol=0.05)  # written in place


def test_a_layer_that_cannot_compile_runs_eagerly_with_a_warning(
    tiny_checkpoint: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The CPU's grouped GEMM takes bf16 only, so compiling the float32 MoE layer fails (a real compile
    error, as a missing toolchain would give): the step still runs, eagerly, and says so."""
    profile = _profile(tiny_checkpoint, "cpu", "eager")
    runners = build_runners(profile, tiny_checkpoint, only=(("thinker", 0),))
    stack, cache = _stacks(runners)["thinker"]
    hidden = stack.layers[0].input_layernorm.weight.shape[0]
    h = torch.randn(2, 1, hidden, generator=torch.Generator().manual_seed(2))
    with torch.inference_mode():
        stack.fuse()
        plain = _step(stack, cache, h)
        stack._layer = CompiledFn(decode_layer, "decode layers")
        with caplog.at_level(logging.WARNING, logger="omnivoice.runners.fused_layers"):
            out = _step(stack, cache, h)
    if stack._layer.compiled:
        pytest.skip("this torch compiles float32 grouped GEMMs on the CPU: no compile failure to test")
    assert "decode layers: not compiled" in caplog.text
    torch.testing.assert_close(out, plain)


def _prefill(stack, cache, rows: int, t: int, hidden: int) -> None:
    slots = [cache.alloc() for _ in range(rows)]
    stack.prefill(torch.zeros(rows, t, hidden, dtype=torch.bfloat16), cache, slots, [0] * rows)
    for slot in slots:
        cache.release(slot)


def test_every_prompt_batch_groups_its_moe_pairs_by_a_sort(
    tiny_checkpoint: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A short prompt (far fewer pairs than SCAN_PAIRS) takes the sort too; a decode step does not."""
    profile = _profile(tiny_checkpoint, "cpu", "eager", "bfloat16")
    runners = build_runners(profile, tiny_checkpoint, only=(("thinker", 0),))
    stack, cache = _stacks(runners)["thinker"]
    calls: list[int] = []
    sort_pairs = fused_layers._sort_pairs
    monkeypatch.setattr(fused_layers, "_sort_pairs", lambda *a: calls.append(1) or sort_pairs(*a))
    hidden = stack.layers[0].input_layernorm.weight.shape[0]
    with torch.inference_mode():
        stack.fuse(prefill=True)
        _step(stack, cache, torch.zeros(2, 1, hidden, dtype=torch.bfloat16))
        assert not calls, "a decode step of two rows sorted its pairs"
        _prefill(stack, cache, 1, 3, hidden)
    assert calls, "a short prompt did not take the sort-based grouping"


def test_warm_prefill_compiles_the_one_kind_of_prompt_batch_and_gives_the_slots_back(
    tiny_checkpoint: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A compiled stack runs one short prompt batch at start; prompt batches of other sizes and
    lengths then compile nothing on a request. The slots it borrowed are free again and hold no
    length."""
    profile = _profile(tiny_checkpoint, "cpu", "eager", "bfloat16")
    runners = build_runners(profile, tiny_checkpoint, only=(("thinker", 0),))
    stack, cache = _stacks(runners)["thinker"]
    free = cache.free_slots
    hidden = stack.layers[0].input_layernorm.weight.shape[0]
    with torch.inference_mode(), caplog.at_level(logging.INFO, logger="omnivoice.runners.decoder"):
        stack.fuse(compile=True, prefill=True)
        stack.warm_prefill(cache, torch.bfloat16)
        assert stack._layer.compiled, "the prefill shape fell back to eager"
        assert cache.free_slots == free and not any(cache.lengths)
        graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
        for rows, t in ((3, 40), (1, 5), (4, 9)):
            _prefill(stack, cache, rows, t, hidden)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == graphs, "a prompt batch compiled again"
    assert "prefill layers compiled" in caplog.text


@pytest.mark.parametrize(
    "error",
    [
        torch.OutOfMemoryError("CUDA out of memory"),
        RuntimeError("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`"),
        torch.AcceleratorError("CUDA error: an illegal memory access was encountered"),
    ],
)
def test_running_out_of_memory_is_no_compile_failure(error: Exception) -> None:
    """An out-of-memory error (torch's or a CUDA library's) or a device fault inside the compiled
    function reaches the caller, and the next call runs compiled again (a compile failure would
    switch to eager for good)."""
    calls = {"n": 0}

    def fn(x: torch.Tensor) -> torch.Tensor:
        return x + 1

    compiled = CompiledFn(fn, "test fn")

    def flaky(*args):
        calls["n"] += 1
        if calls["n"] == 1:
            raise error
        return fn(*args)

    compiled._compiled = flaky
    with pytest.raises(type(error)):
        compiled(torch.zeros(2))
    assert compiled.compiled
    assert torch.equal(compiled(torch.zeros(2)), torch.ones(2)) and calls["n"] == 2
