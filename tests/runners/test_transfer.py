"""ReadBack: queued steps' results reach the host in order, the newest `keep` held back."""

from __future__ import annotations

import pytest
import torch

from omnivoice.runners.transfer import ReadBack, to_host


def test_steps_come_back_oldest_first_keeping_the_newest() -> None:
    queue: ReadBack[str] = ReadBack()
    queue.put("a", torch.tensor([1, 2]))
    queue.put("b", (torch.tensor([3]), None, [None, (torch.ones(2, dtype=torch.bfloat16), torch.zeros(1))]))
    queue.put("c", torch.tensor([4]))
    assert len(queue) == 3
    first = list(queue.take(keep=1))
    assert [record for record, _ in first] == ["a", "b"] and len(queue) == 1
    assert first[0][1].tolist() == [1, 2]
    tokens, nothing, rows = first[1][1]
    assert tokens.tolist() == [3] and nothing is None and rows[0] is None
    assert rows[1][0].dtype == torch.float32 and rows[1][0].tolist() == [1.0, 1.0]  # floats as float32
    assert [record for record, _ in queue.take()] == ["c"] and len(queue) == 0


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_gpu_result_is_copied_into_pinned_memory_without_a_sync() -> None:
    x = torch.arange(6, device="cuda")
    host = to_host(x)
    assert host.is_pinned() and host.device.type == "cpu"
    queue: ReadBack[int] = ReadBack()
    queue.put(0, x * 2)
    ((_, out),) = list(queue.take())
    assert out.tolist() == [0, 2, 4, 6, 8, 10]
