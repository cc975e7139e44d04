"""TMA tensor maps: what Hopper's bulk tensor copies (``cp.async.bulk.tensor``) read a tile by.

A tensor map (the driver's 128-byte ``CUtensorMap``) describes one operand -- its address,
sizes, byte strides -- and the box one copy moves into shared memory, swizzled as wgmma reads
it. The driver encodes it (``cuTensorMapEncodeTiled``); this module calls the driver library
through ctypes, so it needs no package beyond the driver every GPU machine has, and says
clearly when an operand cannot be described (then the kernels keep their cp.async copies).

The box matches the sm90 family's tile layout (sm90/smem.cuh): ``SW`` bytes of the head dim (128
when it is a multiple of 64 elements, else 64) by ``rows`` tokens, with the hardware swizzle of
that span -- the layout that file's ``tile_offset`` computes for its cp.async copies.

Used by the sm90 TMA variants (``TMA``): one producer thread issues the Q and K/V copies, which
leaves the producer warpgroup 24 registers and the consumers the rest. The Hopper backward's
TMA variants copy their chunks the same way, one thread of the CTA issuing them
(:func:`chunk_maps`).
"""

from __future__ import annotations

import ctypes
import functools
from dataclasses import dataclass

import numpy as np

from .device import driver_library

__all__ = ["TileMap", "tile_map", "encode", "launch_maps", "int8_launch_maps", "MAPS_DTYPE",
           "TensorMapError", "driver_encodes_maps", "chunk_maps", "CHUNK_MAPS_DTYPE"]

# CUtensorMapDataType, CUtensorMapSwizzle and friends (cuda.h, CUDA 12 and 13).
DATA_TYPE_UINT8 = 0  # (a copy moves bytes: the 8-bit form's int8 codes)
DATA_TYPE_FLOAT16 = 6
DATA_TYPE_FLOAT32 = 7
DATA_TYPE_BFLOAT16 = 9
SWIZZLE_NONE = 0
SWIZZLE_64B = 2
SWIZZLE_128B = 3
INTERLEAVE_NONE = 0
L2_PROMOTION_128B = 2
OOB_FILL_NONE = 0  # rows past the tensor's end read as zeros
TENSOR_MAP_BYTES = 128
_MAX_BOX = 256
_MAX_STRIDE = 1 << 40


class TensorMapError(ValueError):
    """An operand a tensor map cannot describe, or the driver refused to encode one."""


@dataclass(frozen=True)
class TileMap:
    """The arguments of ``cuTensorMapEncodeTiled`` for one ``[B, H, L, D]`` operand, innermost
    dimension first: ``dims`` (D, L, H, B) in elements, ``strides`` the byte strides of L, H
    and B, ``box`` (SW / 2 elements of D, rows, heads, 1), ``swizzle`` matching SW."""

    dims: tuple[int, int, int, int]
    strides: tuple[int, int, int]
    box: tuple[int, int, int, int]
    swizzle: int
    data_type: int


def tile_map(shape: tuple[int, int, int, int], strides: tuple[int, int, int, int], *,
             bf16: bool, rows: int, heads: int = 1, int8: bool = False,
             swizzle_bytes: int | None = None) -> TileMap:
    """The tensor map of a ``[B, H, L, D]`` operand with element ``strides`` whose tiles are
    ``rows`` tokens of ``heads`` consecutive heads by the whole head dim (a Q tile of GQA-packed
    heads lands head-major, as the kernels index its rows). Raises TensorMapError when TMA
    cannot read it: the head dim not contiguous, a byte stride not a multiple of 16 (or too
    large), a box too big. ``int8``: one-byte elements (the 8-bit form's codes; SW is then the
    row's bytes, 64 or 128). ``swizzle_bytes``: SW as given (a 16-bit V beside int8 Q and K
    takes their 64-byte span at head dim 64)."""
    b, h, l_, d = (int(x) for x in shape)
    elem = 1 if int8 else 2
    sb, sh, sl, sd = (int(x) for x in strides)
    if sd != 1:
        raise TensorMapError(f"the head dim must be contiguous (stride 1), got stride {sd}")
    if d % 32:
        raise TensorMapError(f"head dim {d} is not a multiple of 32 elements")
    byte_strides = (elem * sl, elem * sh, elem * sb)
    for name, s in zip(("token", "head", "batch"), byte_strides):
        if s % 16 or not 0 < s < _MAX_STRIDE:
            raise TensorMapError(f"the {name} stride ({s} bytes) must be a positive multiple of "
                                 f"16 below 2^40")
    if not 0 < rows <= _MAX_BOX or not 0 < heads <= min(h, _MAX_BOX):
        raise TensorMapError(f"a box holds 1 to {_MAX_BOX} rows of 1 to {min(h, _MAX_BOX)} "
                             f"heads, got {rows} rows of {heads}")
    sw = swizzle_bytes or (128 if d * elem % 128 == 0 else 64)
    return TileMap(dims=(d, l_, h, b), strides=byte_strides, box=(sw // elem, rows, heads, 1),
                   swizzle=SWIZZLE_128B if sw == 128 else SWIZZLE_64B,
                   data_type=DATA_TYPE_UINT8 if int8 else
                   DATA_TYPE_BFLOAT16 if bf16 else DATA_TYPE_FLOAT16)


@functools.lru_cache(maxsize=1)
def _driver_encoder():
    """libcuda's cuTensorMapEncodeTiled with its argument types, or None without a driver."""
    lib = driver_library()
    fn = getattr(lib, "cuTensorMapEncodeTiled", None) if lib is not None else None
    if fn is None:  # no driver, or one older than CUDA 12
        return None
    u64p, u32p = ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(ctypes.c_uint32)
    fn.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32, ctypes.c_void_p, u64p,
                   u64p, u32p, u32p, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int]
    fn.restype = ctypes.c_int
    return fn


def driver_encodes_maps() -> bool:
    """Whether this machine's CUDA driver can encode tensor maps (cuTensorMapEncodeTiled): where
    it cannot, every launch copies by cp.async."""
    return _driver_encoder() is not None


def encode(m: TileMap, address: int, encoder=None) -> bytes:
    """The 128-byte tensor map of ``m`` at device ``address`` (16-byte aligned), encoded by the
    driver (``encoder``: a stand-in with the driver function's signature, for tests)."""
    if address % 16:
        raise TensorMapError(f"the operand's address must be 16-byte aligned, got {address:#x}")
    fn = encoder or _driver_encoder()
    if fn is None:
        raise TensorMapError("no CUDA driver with cuTensorMapEncodeTiled (CUDA 12 or newer) "
                             "was found")
    out = (ctypes.c_uint8 * (TENSOR_MAP_BYTES + 127))()
    base = ctypes.addressof(out)
    aligned = base + (-base % 128)  # CUtensorMap is 128-byte aligned (cuda.h)
    dims = (ctypes.c_uint64 * 4)(*m.dims)
    strides = (ctypes.c_uint64 * 3)(*m.strides)
    box = (ctypes.c_uint32 * 4)(*m.box)
    element_strides = (ctypes.c_uint32 * 4)(1, 1, 1, 1)
    rc = fn(ctypes.c_void_p(aligned), m.data_type, 4, ctypes.c_void_p(address), dims, strides,
            box, element_strides, INTERLEAVE_NONE, m.swizzle, L2_PROMOTION_128B, OOB_FILL_NONE)
    if rc != 0:
        raise TensorMapError(f"cuTensorMapEncodeTiled failed (CUresult {rc}) for {m}")
    return ctypes.string_at(aligned, TENSOR_MAP_BYTES)


# The kernels' TmaMaps parameter (common/task.cuh): q's, k's and v's maps, and the 8-bit form's
# K steps' (zeros elsewhere), 128 bytes each.
MAPS_DTYPE = np.dtype([("maps", np.uint64, (4 * TENSOR_MAP_BYTES // 8,))])
_NO_MAP = bytes(TENSOR_MAP_BYTES)


def launch_maps(q, k, v, *, bf16: bool, tile_rows: int, heads_per_task: int, block_n: int,
                encoder=None) -> np.void:
    """The TmaMaps argument of one launch: ``q``, ``k`` and ``v`` are (address, [B, H, L, D]
    shape, element strides); Q tiles of ``tile_rows`` tokens of ``heads_per_task`` heads, K/V
    chunks of ``block_n`` keys. Raises TensorMapError when one of them cannot be described
    (the launch then takes the cp.async variant)."""
    blobs = []
    for (address, shape, strides), rows, heads in ((q, tile_rows, heads_per_task),
                                                  (k, block_n, 1), (v, block_n, 1)):
        m = tile_map(shape, strides, bf16=bf16, rows=rows, heads=heads)
        blobs.append(encode(m, int(address), encoder))
    return np.frombuffer(b"".join(blobs) + _NO_MAP, dtype=MAPS_DTYPE)[0]


def int8_launch_maps(q: tuple, k: tuple, v_t: tuple | None, k_steps: tuple, *, tile_rows: int,
                     heads_per_task: int, block_n: int, v16: tuple | None = None,
                     bf16: bool = True, encoder=None) -> np.void:
    """The TmaMaps argument of an 8-bit launch (sm90/traits.cuh's INT8), from the pre-pass's
    arrays (tessera/quantize_launch.py), each (address, shape, element strides): ``q`` and
    ``k`` int8 ``[B, H, L, D]`` as :func:`launch_maps` describes them; ``v_t`` int8 ``[B, Hkv,
    D, L_pad]``, a box of ``block_n`` keys by every channel, swizzled over the keys' bytes;
    ``k_steps`` float32 ``[B, Hkv, L_pad]``, a box of ``block_n`` steps. Scores-only (``v_t``
    None): ``v16``, the caller's 16-bit V ``[B, Hkv, L, D]`` (``bf16`` or fp16), boxes of
    ``block_n`` keys at the int8 tiles' swizzle span. Raises TensorMapError when one cannot be
    described."""
    (qa, qs, qst), (ka, ks, kst) = q, k
    blobs = [encode(tile_map(qs, qst, bf16=False, rows=tile_rows, heads=heads_per_task,
                             int8=True), int(qa), encoder),
             encode(tile_map(ks, kst, bf16=False, rows=block_n, int8=True), int(ka), encoder)]
    if v_t is None:
        va, vs, vst = v16
        span = 128 if qs[3] % 128 == 0 else 64  # the int8 rows' swizzle span
        blobs.append(encode(tile_map(vs, vst, bf16=bf16, rows=block_n, swizzle_bytes=span),
                            int(va), encoder))
    else:
        (va, (b, h, d, pad), (vsb, vsh, vsd, vsl)) = v_t
        if vsl != 1 or pad % 16 or block_n not in (64, 128):
            raise TensorMapError(f"V^T must have contiguous keys padded to 16 and a box of 64 "
                                 f"or 128 keys, got strides {(vsb, vsh, vsd, vsl)}, {pad} keys, "
                                 f"{block_n}")
        blobs.append(encode(TileMap(dims=(pad, d, h, b), strides=(vsd, vsh, vsb),
                                    box=(block_n, d, 1, 1),
                                    swizzle=SWIZZLE_128B if block_n == 128 else SWIZZLE_64B,
                                    data_type=DATA_TYPE_UINT8), int(va), encoder))
    (sa, (sb_, sh_, spad), (ssb, ssh, ssl)) = k_steps
    if ssl != 1 or (4 * spad) % 16:
        raise TensorMapError(f"the K steps must be contiguous rows of a multiple of 4 floats, got "
                             f"strides {(ssb, ssh, ssl)}, {spad} keys")
    blobs.append(encode(TileMap(dims=(spad, sh_, sb_, 1), strides=(4 * ssh, 4 * ssb, 4 * ssb * sb_),
                                box=(block_n, 1, 1, 1), swizzle=SWIZZLE_NONE,
                                data_type=DATA_TYPE_FLOAT32), int(sa), encoder))
    return np.frombuffer(b"".join(blobs), dtype=MAPS_DTYPE)[0]


# The backward kernels' ChunkMaps parameter (common/backward.cuh): the maps of the two operands
# their chunks copy (dK/dV: Q and dO; dQ: K and V), 128 bytes each.
CHUNK_MAPS_DTYPE = np.dtype([("maps", np.uint64, (2 * TENSOR_MAP_BYTES // 8,))])


def chunk_maps(a, b, *, bf16: bool, rows: int, encoder=None) -> np.void:
    """The ChunkMaps argument of a backward launch that copies its chunks by TMA: ``a`` and
    ``b`` are (address, [B, H, L, D] shape, element strides) of the two operands a chunk holds,
    ``rows`` tokens of one head a box. Raises TensorMapError when one cannot be described (the
    launch then takes the cp.async variant)."""
    blobs = [encode(tile_map(shape, strides, bf16=bf16, rows=rows), int(address), encoder)
             for address, shape, strides in (a, b)]
    return np.frombuffer(b"".join(blobs), dtype=CHUNK_MAPS_DTYPE)[0]
