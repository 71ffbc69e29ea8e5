"""``udpo.algorithms.transfer``: host/device copies that do not block the host. On a CPU the results must equal the
plain operations they replace; the non-blocking GPU branch is checked where CUDA is present."""

import pytest
import torch

from udpo.algorithms.transfer import host_floats, lists_to_device, to_device


def test_host_floats_equals_item_for_each_value_and_keeps_the_order():
    stats = {
        "loss": torch.tensor(1.25, requires_grad=True) * 2,
        "ratio_min": torch.tensor([0.5, 0.25]).min(),
        "clip": (torch.tensor([1.0, 3.0]) > 2).float().mean(),
        "count": torch.tensor(3),  # an integer scalar comes back as a float
        "shaped": torch.tensor([[7.0]]),  # one value in any shape
    }
    out = host_floats(stats)
    assert list(out) == list(stats)
    assert out == {"loss": 2.5, "ratio_min": 0.25, "clip": 0.5, "count": 3.0, "shaped": 7.0}
    assert all(type(v) is float for v in out.values())
    with pytest.raises(RuntimeError):
        host_floats({"two values": torch.tensor([1.0, 2.0])})


def test_to_device_on_the_cpu_returns_the_same_values_and_dtype():
    t = torch.arange(6, dtype=torch.long)
    moved = to_device(t, "cpu")
    assert moved.dtype == torch.long and torch.equal(moved, t)
    assert torch.equal(to_device(torch.ones(2), torch.device("cpu")), torch.ones(2))


def test_lists_to_device_gives_one_tensor_a_list_in_order_empty_ones_included():
    out = lists_to_device([[1, 2], [], [3]], "cpu", torch.long)
    assert [t.tolist() for t in out] == [[1, 2], [], [3]] and all(t.dtype == torch.long for t in out)
    (half,) = lists_to_device([[0.5, -1.25]], torch.device("cpu"), torch.float32)
    assert half.dtype == torch.float32 and half.tolist() == [0.5, -1.25]
    assert lists_to_device([], "cpu", torch.float32) == []


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the GPU branch needs CUDA")
def test_to_device_on_a_gpu_copies_without_a_sync_and_arrives_whole():
    t = torch.arange(1000, dtype=torch.long)
    torch.cuda.set_sync_debug_mode("error")  # a synchronizing call raises
    try:
        moved = to_device(t, "cuda")
        again = to_device(moved, "cuda")  # already there: no copy from the host
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert torch.equal(moved.cpu(), t) and again.data_ptr() == moved.data_ptr()
