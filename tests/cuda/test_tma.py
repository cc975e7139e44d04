"""Tensor maps (tessera/cuda/tma.py): the encoder's arguments for each layout and head dim, the
operands TMA cannot read, and the driver call (a stand-in here; the real driver on a GPU)."""



import ctypes

import numpy as np
import pytest

from tessera import launch, operands
from tessera.cuda import tma


def bhld_strides(b, h, l_, d):
    return (h * l_ * d, l_ * d, d, 1)


def test_tile_map_for_each_head_dim_and_layout():
    m = tma.tile_map((2, 12, 1000, 128), bhld_strides(2, 12, 1000, 128), bf16=True, rows=128)
    assert m.dims == (128, 1000, 12, 2)
    assert m.strides == (256, 256 * 1000, 256 * 1000 * 12)
    assert m.box == (64, 128, 1, 1)  # 128 bytes of the head dim: two boxes make a D=128 tile
    assert m.swizzle == tma.SWIZZLE_128B and m.data_type == tma.DATA_TYPE_BFLOAT16
    # head dim 96: 64-byte chunks (sm90/traits.cuh's SW), 64-byte swizzle
    m = tma.tile_map((1, 2, 64, 96), bhld_strides(1, 2, 64, 96), bf16=False, rows=64)
    assert m.box == (32, 64, 1, 1) and m.swizzle == tma.SWIZZLE_64B
    assert m.data_type == tma.DATA_TYPE_FLOAT16
    # [B, L, H, D] storage seen as [B, H, L, D]: the token stride spans the heads
    b, l_, h, d = 1, 300, 8, 64
    m = tma.tile_map((b, h, l_, d), (l_ * h * d, d, h * d, 1), bf16=True, rows=64)
    assert m.strides == (2 * h * d, 2 * d, 2 * l_ * h * d)


@pytest.mark.parametrize("shape,strides,rows,match", [
    ((1, 2, 64, 128), (2 * 64 * 128, 64 * 128, 1, 64), 64, "contiguous"),
    ((1, 2, 64, 80), bhld_strides(1, 2, 64, 80), 64, "multiple of 32"),
    ((1, 2, 64, 64), (2 * 64 * 100, 64 * 100, 100, 1), 64, "token stride"),
    ((1, 2, 64, 64), (64 * 64, 0, 64, 1), 64, "head stride"),  # broadcast over heads
    ((1, 2, 64, 64), bhld_strides(1, 2, 64, 64), 0, "rows"),
    ((1, 2, 64, 64), bhld_strides(1, 2, 64, 64), 512, "rows"),
])
def test_operands_tma_cannot_read(shape, strides, rows, match):
    with pytest.raises(tma.TensorMapError, match=match):
        tma.tile_map(shape, strides, bf16=True, rows=rows)


def fake_encoder(calls, rc=0):
    """A stand-in for cuTensorMapEncodeTiled: records its arguments, writes a pattern."""
    def fn(out, data_type, rank, address, dims, strides, box, element_strides, interleave,
           swizzle, l2, oob):
        calls.append(dict(out=out.value, data_type=data_type, rank=rank, address=address.value,
                          dims=list(dims[:rank]), strides=list(strides[:rank - 1]),
                          box=list(box[:rank]), element_strides=list(element_strides[:rank]),
                          interleave=interleave, swizzle=swizzle, l2=l2, oob=oob))
        ctypes.memmove(out.value, bytes(range(128)), 128)
        return rc
    return fn


def test_encode_passes_the_map_to_the_driver():
    m = tma.tile_map((1, 4, 500, 128), bhld_strides(1, 4, 500, 128), bf16=True, rows=128)
    calls = []
    blob = tma.encode(m, 0x7F0000001000, encoder=fake_encoder(calls))
    assert blob == bytes(range(128))
    (c,) = calls
    assert c["out"] % 128 == 0  # CUtensorMap's alignment
    assert c["rank"] == 4 and c["address"] == 0x7F0000001000
    assert c["dims"] == [128, 500, 4, 1] and c["strides"] == [256, 256 * 500, 256 * 500 * 4]
    assert c["box"] == [64, 128, 1, 1] and c["element_strides"] == [1, 1, 1, 1]
    assert (c["data_type"], c["swizzle"], c["interleave"]) == (9, 3, 0)
    assert c["oob"] == tma.OOB_FILL_NONE  # rows past the tensor read as zeros


def test_encode_errors():
    m = tma.tile_map((1, 1, 64, 64), bhld_strides(1, 1, 64, 64), bf16=True, rows=64)
    with pytest.raises(tma.TensorMapError, match="16-byte aligned"):
        tma.encode(m, 0x1008, encoder=fake_encoder([]))
    with pytest.raises(tma.TensorMapError, match="CUresult 1"):
        tma.encode(m, 0x1000, encoder=fake_encoder([], rc=1))


def test_launch_maps_for_q_k_v():
    """One launch's TmaMaps: Q tiles of tile_rows tokens of the GQA-packed heads, K/V chunks of
    block_n keys; 512 bytes in q, k, v order and an empty fourth map (common/task.cuh's TmaMaps)."""
    calls = []
    q = (0x10000, (1, 8, 500, 128), bhld_strides(1, 8, 500, 128))
    k = (0x20000, (1, 2, 700, 128), bhld_strides(1, 2, 700, 128))
    v = (0x30000, (1, 2, 700, 128), bhld_strides(1, 2, 700, 128))
    maps = tma.launch_maps(q, k, v, bf16=True, tile_rows=32, heads_per_task=4, block_n=128,
                           encoder=fake_encoder(calls))
    assert maps.dtype == tma.MAPS_DTYPE and len(bytes(maps)) == 512 and not any(bytes(maps)[384:])
    assert [c["address"] for c in calls] == [0x10000, 0x20000, 0x30000]
    assert calls[0]["box"] == [64, 32, 4, 1] and calls[0]["dims"] == [128, 500, 8, 1]
    assert calls[1]["box"] == calls[2]["box"] == [64, 128, 1, 1]
    assert calls[1]["dims"] == [128, 700, 2, 1]
    with pytest.raises(tma.TensorMapError, match="heads"):
        tma.launch_maps(q, k, v, bf16=True, tile_rows=32, heads_per_task=16, block_n=128,
                        encoder=fake_encoder([]))


def test_chunk_maps_of_a_backward_launch():
    """A backward kernel's ChunkMaps: boxes of `rows` tokens of one head of the two operands a
    chunk holds (dK/dV: Q and dO in the blhd layout here), 256 bytes in that order
    (common/backward.cuh's ChunkMaps); an operand TMA cannot read is refused."""
    calls = []
    strides = (500 * 8 * 96, 96, 8 * 96, 1)  # blhd, in (b, h, l, d) order
    q = (0x10000, (2, 8, 500, 96), strides)
    dout = (0x20000, (2, 8, 500, 96), strides)
    maps = tma.chunk_maps(q, dout, bf16=False, rows=64, encoder=fake_encoder(calls))
    assert maps.dtype == tma.CHUNK_MAPS_DTYPE and len(bytes(maps)) == 256
    assert [c["address"] for c in calls] == [0x10000, 0x20000]
    for c in calls:
        assert c["box"] == [32, 64, 1, 1] and c["dims"] == [96, 500, 8, 2]
        assert c["strides"] == [2 * 8 * 96, 2 * 96, 2 * 500 * 8 * 96]
        assert (c["data_type"], c["swizzle"]) == (6, 2)  # fp16, 64-byte swizzle
    odd = (0x30000, (1, 2, 100, 64), (100 * 2 * 68, 68, 2 * 68, 1))  # heads 136 bytes apart
    with pytest.raises(tma.TensorMapError, match="multiple of 16"):
        tma.chunk_maps(q, odd, bf16=True, rows=64, encoder=fake_encoder([]))


def test_launch_without_a_driver_keeps_cp_async(monkeypatch):
    """No driver encoder (CPU machines, old drivers): the launch's maps are None, so it takes
    the cp.async variant."""
    import tessera

    monkeypatch.setattr(tma, "_driver_encoder", lambda: None)
    launch._encoded_maps.cache_clear()
    m = tessera.BlockMask.from_dense(np.ones((1, 2, 2), bool), block_size=128)
    p = tessera.plan(m, num_q_heads=2, head_dim=128, arch=90)

    class Desc:
        ptr = 0x1000

    ops = operands.Operands(q=Desc(), k=Desc(), v=Desc(), shape_q=(1, 2, 256, 128),
                        shape_kv=(1, 2, 256, 128), strides_q=bhld_strides(1, 2, 256, 128),
                        strides_k=bhld_strides(1, 2, 256, 128),
                        strides_v=bhld_strides(1, 2, 256, 128), stream_ptr=0)
    assert launch._tma_maps(p, ops, bf16=True) is None
    launch._encoded_maps.cache_clear()
    assert len(bytes(launch._NO_MAPS)) == 512 and not any(bytes(launch._NO_MAPS))
