"""GPU: tessera.attention against the float64 reference, outputs poisoned first (every element
must be written), on fresh random inputs. Marked ``gpu``: skipped where there is no GPU."""

from __future__ import annotations

import numpy as np
import pytest

import tessera
import tessera.cuda.device
from tessera import api, launch, operands, reference
from tessera.interop import cupy_bfloat16
from tessera.runtime.cache import PlanCache
from tessera.runtime.mode import PlanMode
from tessera.runtime.regime import Regime, default_regime
from tests.runtime.runtime_helpers import assert_same_non_finite, poisoned_restricted_case

pytestmark = pytest.mark.gpu

TOL = {"bfloat16": 1e-2, "float16": 5e-3}
# A single row's error: its 64-128 rounded outputs average less than the whole tensor's.
TOL_ROW = {"bfloat16": 2.5e-2, "float16": 1.25e-2}


@pytest.fixture(autouse=True)
def _poison(monkeypatch):
    monkeypatch.setattr(tessera.config, "poison_outputs", True)
    yield
    import sys

    if "cupy" in sys.modules:  # CuPy's cached blocks (a test's fills) back to the device
        sys.modules["cupy"].get_default_memory_pool().free_all_blocks()


def _torch():
    return pytest.importorskip("torch")


def _inputs(rng, fw, dtype, b, hq, hkv, lq, lkv, d, layout):
    """Random q, k, v on the GPU in framework ``fw`` and their exact float64 values."""
    def make(h, length):
        shape = (b, h, length, d) if layout == "bhld" else (b, length, h, d)
        return rng.standard_normal(shape).astype(np.float32)

    host = [make(hq, lq), make(hkv, lkv), make(hkv, lkv)]
    if fw == "torch":
        torch = _torch()
        tdt = getattr(torch, dtype)
        dev = [torch.from_numpy(x).to("cuda", tdt) for x in host]
        exact = [t.float().cpu().numpy().astype(np.float64) for t in dev]
    elif fw == "cupy":
        import cupy as cp

        if dtype == "float16":
            dev = [cp.asarray(x.astype(np.float16)) for x in host]
            exact = [x.astype(np.float16).astype(np.float64) for x in host]
        else:  # bfloat16: CuPy 14 holds it with ml_dtypes
            bf16 = cupy_bfloat16()
            if bf16 is None:
                return _inputs(rng, "torch", dtype, b, hq, hkv, lq, lkv, d, layout)
            bits = [x.view(np.uint32) >> 16 for x in host]  # bf16 = the top half of fp32
            dev = [cp.asarray(x.astype(np.uint16)).view(bf16) for x in bits]
            exact = [(x << 16).view(np.float32).astype(np.float64) for x in bits]
    else:
        jax = pytest.importorskip("jax")
        jnp = jax.numpy
        dev = [jnp.asarray(x, dtype=getattr(jnp, dtype)) for x in host]
        exact = [np.asarray(t.astype(jnp.float32)).astype(np.float64) for t in dev]
    return dev, exact


def _to_numpy(x):
    if type(x).__module__.startswith("torch"):
        return x.float().cpu().numpy().astype(np.float64)
    if type(x).__module__.startswith("cupy"):
        if x.dtype.name == "bfloat16":  # its bits as the top half of float32
            return (x.view(np.uint16).get().astype(np.uint32) << 16).view(np.float32).astype(
                np.float64)
        return x.get().astype(np.float64)
    return np.asarray(x.astype("float32")).astype(np.float64)


def _check(mask, fw="cupy", dtype="bfloat16", b=1, hq=2, hkv=None, d=64, layout="bhld",
           seed=0, regime=None, return_lse=True, scale=None):
    hkv = hq if hkv is None else hkv
    rng = np.random.default_rng(seed)
    (q, k, v), (qe, ke, ve) = _inputs(rng, fw, dtype, b, hq, hkv, mask.seq_len_q,
                                      mask.seq_len_kv, d, layout)
    res = tessera.attention(q, k, v, mask, layout=layout, return_lse=return_lse, regime=regime,
                            scale=scale)
    out, lse = res if return_lse else (res, None)
    ref_out, ref_lse = reference.attention(qe, ke, ve, mask, return_lse=True, layout=layout,
                                           scale=scale)
    got = _to_numpy(out)
    assert not np.isnan(got).any(), "output has NaN (unwritten or broken)"
    err = np.linalg.norm(got - ref_out) / max(np.linalg.norm(ref_out), 1e-30)
    assert err <= TOL[dtype], f"relative error {err:.2e}"
    assert_rows_close(got, ref_out, dtype)
    if return_lse:
        gl = _to_numpy(lse)
        assert not np.isnan(gl).any(), "lse has NaN"
        assert np.array_equal(np.isneginf(gl), np.isneginf(ref_lse))
        fin = np.isfinite(ref_lse)
        assert np.abs(gl[fin] - ref_lse[fin]).max(initial=0) < 2e-2
    return out


def assert_rows_close(got, ref, dtype):
    """The worst row, not only the whole tensor: every output row's relative error within
    TOL_ROW, and rows the mask leaves empty exactly zero."""
    g = got.reshape(-1, got.shape[-1])
    r = ref.reshape(-1, ref.shape[-1])
    norm = np.linalg.norm(r, axis=1)
    empty = norm == 0
    assert not np.abs(g[empty]).any(), "a row that selects nothing is not zero"
    rows = np.linalg.norm(g[~empty] - r[~empty], axis=1) / norm[~empty]
    worst = rows.max(initial=0.0)
    assert worst <= TOL_ROW[dtype], f"worst row's relative error {worst:.2e}"


def _device_cc() -> int:
    from tessera.cuda.loader import device_cc

    return device_cc()


def _regime(family: str, block_m: int = 128, block_n: int | None = None, **policy) -> Regime:
    """A regime of kernel ``family`` ("sm80"; "sm90" or its warp-specialized "sm90ws", both
    skipped off Hopper) with tiles of ``block_m`` rows; block_n defaults to the family's (64 for
    sm80, 128 for sm90)."""
    if family.startswith("sm90"):
        if _device_cc() != 90:
            pytest.skip("the sm90 family runs on Hopper only")
        producer_warps = 4 if family == "sm90ws" else 0
        return Regime(family="sm90", block_m=block_m, num_warps=block_m // 16 + producer_warps,
                      block_n=block_n or 128, stages=3, **policy)
    return Regime(block_m=block_m, num_warps=4, block_n=block_n or 64, **policy)


FAMILIES = ["sm80", "sm90", "sm90ws"]


def _random_mask(rng, shape, density, **geo):
    return tessera.BlockMask.from_dense(rng.random(shape) < density, **geo)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("d", [64, 96, 128])
@pytest.mark.parametrize("layout", ["bhld", "blhd"])
@pytest.mark.parametrize("family", ["default", "sm80", "sm80-64"])
def test_dtype_headdim_layout(dtype, d, layout, family):
    """The default regime (sm90 on Hopper) and the portable family everywhere: the regime an
    Ampere GPU plans by default (128-row tiles, two row tiles a warp) and 64-row tiles."""
    rng = np.random.default_rng(d)
    m = _random_mask(rng, (2, 8, 9), 0.35, block_size=128, seq_len_q=1000, seq_len_kv=1100)
    regime = {"default": None, "sm80": default_regime(80, d),
              "sm80-64": Regime(block_m=64, num_warps=4)}[family]
    _check(m, dtype=dtype, d=d, layout=layout, hq=2, regime=regime)


def _regime_stress_mask():
    """Variable blocks (some shorter than a row group), an empty row, a heavy row that splits
    under split_ratio 2 or 4, and adjacent short rows a 0.3 combine threshold merges."""
    rng = np.random.default_rng(21)
    qb = np.r_[0, np.cumsum([40, 24, 130, 8, 64, 200, 96, 16, 48, 120])]
    kb = np.r_[0, np.cumsum(rng.integers(16, 150, 40))]
    dense = rng.random((2, qb.size - 1, kb.size - 1)) < 0.25
    dense[:, 3] = False  # empty row
    dense[0, 5] = True  # heavy row
    dense[:, 1] = dense[:, 0]  # adjacent short blocks with shared keys
    dense[:, 1, :3] = True
    return tessera.BlockMask.from_dense(dense, q_bounds=qb, kv_bounds=kb)


def _candidates():
    from tessera.runtime.regime import candidate_regimes

    return [(d, i, r) for d in (64, 128) for i, r in enumerate(candidate_regimes(d, 90))]


@pytest.mark.parametrize("d,index,regime", _candidates(),
                         ids=[f"d{d}-{r.name}" for d, _, r in _candidates()])
def test_every_candidate_regime(d, index, regime):
    """Every regime the profiler may put in a table computes the exact attention."""
    if regime.family == "sm90" and _device_cc() != 90:
        pytest.skip("the sm90 family runs on Hopper only")
    _check(_regime_stress_mask(), d=d, hq=2, regime=regime, seed=index)


@pytest.mark.parametrize("group", [1, 2, 4, 8])
@pytest.mark.parametrize("mask_heads", ["one", "kv", "q"])
@pytest.mark.parametrize("family", FAMILIES)
def test_gqa(group, mask_heads, family):
    rng = np.random.default_rng(group)
    hkv = 2
    hq = hkv * group
    h = {"one": 1, "kv": hkv, "q": hq}[mask_heads]
    m = _random_mask(rng, (h, 6, 6), 0.4, block_size=64, seq_len_q=370, seq_len_kv=380)
    _check(m, hq=hq, hkv=hkv, d=128, b=2, regime=_regime(family))


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("block_m", [64, 128])
def test_variable_blocks_and_empty_rows(family, block_m):
    rng = np.random.default_rng(5)
    qs = rng.integers(16, 300, size=9)
    ks = rng.integers(8, 200, size=11)
    dense = rng.random((3, 9, 11)) < 0.3
    dense[:, 2, :] = False  # an empty query block: output 0, lse -inf
    m = tessera.BlockMask.from_dense(dense, q_bounds=np.r_[0, np.cumsum(qs)],
                                     kv_bounds=np.r_[0, np.cumsum(ks)])
    _check(m, hq=3, d=128, regime=_regime(family, block_m))


@pytest.mark.parametrize("family", FAMILIES)
def test_64_token_blocks_combined_onto_128_rows(family):
    rng = np.random.default_rng(6)
    pairs = np.repeat(rng.random((2, 16, 32)) < 0.2, 2, axis=1)
    m = tessera.BlockMask.from_dense(pairs, block_size=64)
    reg = _regime(family, block_n=64)  # key spans of 64-token blocks fill 64-key steps
    assert tessera.plan(m, num_q_heads=2, head_dim=128, regime=reg).stats().wasted_ratio == 1.0
    _check(m, hq=2, d=128, regime=reg)


@pytest.mark.parametrize("producer", [False, True])
@pytest.mark.parametrize("block_m,block_n", [(64, 64), (128, 64), (128, 128)])
@pytest.mark.parametrize("d", [64, 96, 128])
def test_packed_keys(producer, block_m, block_n, d):
    """pack_keys: a task's keys walked end to end -- key blocks shorter than a step (8 to 90
    tokens) sharing chunks, spans ending mid-chunk, GQA, an empty row, a ragged last block.
    Head dims 64, 96 and 128: one, three and two column chunks a row for the packed gather's
    copies (sm90/loads.cuh load_kv), 128 or 256 loading threads."""
    if _device_cc() != 90:
        pytest.skip("the sm90 family runs on Hopper only")
    rng = np.random.default_rng(block_m + block_n + d + producer)
    qs = rng.integers(16, 200, size=8)
    ks = rng.integers(8, 90, size=30)
    dense = rng.random((2, 8, 30)) < 0.35
    dense[:, 4, :] = False
    m = tessera.BlockMask.from_dense(dense, q_bounds=np.r_[0, np.cumsum(qs)],
                                     kv_bounds=np.r_[0, np.cumsum(ks)])
    reg = Regime(family="sm90", block_m=block_m, block_n=block_n,
                 num_warps=block_m // 16 + (4 if producer else 0), stages=3,
                 combine_threshold=0.0, pack_keys=True)
    _check(m, hq=4, hkv=2, d=d, regime=reg)


@pytest.mark.parametrize("pack", [False, True])
@pytest.mark.parametrize("d", [64, 96])
def test_three_consumer_warpgroups(d, pack):
    """192-row tiles: three consumer warpgroups taking turns on named barriers 1-3 (the
    producer's own barrier after them); variable blocks, an empty row, GQA, a ragged end."""
    if _device_cc() != 90:
        pytest.skip("the sm90 family runs on Hopper only")
    rng = np.random.default_rng(d + pack)
    qs = rng.integers(16, 400, size=9)
    ks = rng.integers(8, 200, size=25)
    dense = rng.random((2, 9, 25)) < 0.35
    dense[:, 3] = False
    m = tessera.BlockMask.from_dense(dense, q_bounds=np.r_[0, np.cumsum(qs)],
                                     kv_bounds=np.r_[0, np.cumsum(ks)])
    reg = Regime(family="sm90", block_m=192, num_warps=16, block_n=64, stages=3,
                 combine_threshold=0.0, pack_keys=pack)
    for hq, hkv in ((2, 2), (4, 2)):
        _check(m, hq=hq, hkv=hkv, d=d, regime=reg)


@pytest.mark.parametrize("tma", [True, False])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_three_consumer_warpgroups_with_128_key_steps(dtype, tma, monkeypatch):
    """The head-dim-64 regime for query blocks that fill 192-row tiles (SM90_ROWS192_D64): its
    TMA form steps 128 keys with the P V overlap, its cp.async form 64 keys over the same plan;
    blocks of 192-400 tokens (tiles whose second and third warpgroups sit out), an empty row,
    GQA, a ragged end, and a 384-token geometry planned by the selection (which picks it where
    no regime table answers first: tests/runtime/regime/test_heuristic.py)."""
    from tessera.runtime.regime.heuristic import SM90_ROWS192_D64

    if _device_cc() != 90:
        pytest.skip("the sm90 family runs on Hopper only")
    monkeypatch.setattr(tessera.config, "use_tma", tma)
    rng = np.random.default_rng(5 + tma)
    qs = rng.integers(192, 400, size=7)
    qs[-1] = 37  # a short last block: warpgroups 1 and 2 sit its tile out
    ks = rng.integers(8, 300, size=20)
    dense = rng.random((2, 7, 20)) < 0.4
    dense[:, 2] = False
    m = tessera.BlockMask.from_dense(dense, q_bounds=np.r_[0, np.cumsum(qs)],
                                     kv_bounds=np.r_[0, np.cumsum(ks)])
    for hq, hkv in ((2, 2), (4, 2)):
        _check(m, hq=hq, hkv=hkv, d=64, dtype=dtype, regime=SM90_ROWS192_D64)
    big = np.arange(0, 9 * 384 + 1, 384)
    m = tessera.BlockMask.from_dense(rng.random((2, 9, 9)) < 0.5, q_bounds=big, kv_bounds=big)
    _check(m, hq=2, d=64, dtype=dtype)
    _check(m, hq=2, d=64, dtype=dtype, regime=SM90_ROWS192_D64)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_wide_key_steps(dtype, monkeypatch):
    """Regime.wide_steps: the TMA variant at head dim 64 walks tasks of a few long spans 192
    keys a step and the rest 128 (one persistent launch mixing both): long rows, a span ending
    mid-step, short spans, GQA, an empty row, a ragged end; equal to the cp.async variant
    (128-key steps only) up to rounding, and to the reference."""
    import cupy as cp

    from tessera.runtime.tasks import wide_step_tasks

    if _device_cc() != 90:
        pytest.skip("the sm90 family runs on Hopper only")
    rng = np.random.default_rng(192)
    qs, ks = rng.integers(16, 400, size=9), rng.integers(8, 120, size=40)
    ks[:6] = (700, 1000, 37, 130, 900, 400)
    dense = rng.random((2, 9, 40)) < 0.3
    dense[:, 3] = False
    dense[:, 5] = True  # every key: one span of all keys
    dense[:, 6] = False
    dense[:, 6, [0, 1, 4]] = True  # three long spans
    m = tessera.BlockMask.from_dense(dense, q_bounds=np.r_[0, np.cumsum(qs)],
                                     kv_bounds=np.r_[0, np.cumsum(ks)])
    reg = Regime(family="sm90", block_m=128, num_warps=12, block_n=128, stages=3,
                 combine_threshold=0.0, wide_steps=True)
    assert reg.variant(64, tma=True).kv_rows == 192 and reg.variant(96, tma=True).kv_rows == 128
    assert reg.with_(wide_steps=False).variant(64, tma=True).kv_rows == 128
    for hq, hkv in ((2, 2), (4, 2)):
        p = tessera.plan(m, num_q_heads=hq, num_kv_heads=hkv, head_dim=64, dtype=dtype,
                         regime=reg)
        queue = p.launch_queue
        wide = wide_step_tasks(cp.asnumpy(queue.tasks), cp.asnumpy(queue.spans), 128, 192)
        assert wide.any() and not wide.all()
        with_tma = _check(m, hq=hq, hkv=hkv, d=64, regime=reg, dtype=dtype)
        monkeypatch.setattr(tessera.config, "use_tma", False)
        narrow = _check(m, hq=hq, hkv=hkv, d=64, regime=reg, dtype=dtype)
        monkeypatch.setattr(tessera.config, "use_tma", True)
        a, b = (_to_numpy(x).astype(np.float32) for x in (with_tma, narrow))
        assert np.abs(a - b).max() <= 2e-2 * np.abs(b).max()


@pytest.mark.parametrize("name,d,wide", [
    ("sm90_128x128_w12_s3", 128, False), ("sm90_128x128_w12_s3", 64, True),
    ("sm90_64x64_w20_s3", 64, False), ("sm90_192x128_w16_s3", 64, False),
    ("sm90_64x128_w8_s3", 128, False), ("sm90_64x64_w8_s3", 128, False)])
def test_whole_span_tasks(name, d, wide, monkeypatch):
    """Whole-span tasks (one span over all of a tile's rows, walked without the chunks' staged
    fields by the rings at head dim 64; other variants take the general walk) in one persistent
    launch with tasks of several spans and of restricted rows: spans ending inside a step, whose
    last chunk reads a key block no query selects that holds NaN keys and Inf / NaN values
    (masked, its V rows zeroed), GQA, a ragged end, several tasks a CTA; against the float64
    reference, every output written."""
    import cupy as cp

    from tessera.runtime.queue import Task
    from tessera.runtime.regime import regime_from_name
    from tessera.runtime.tasks import whole_span_tasks

    if _device_cc() != 90:
        pytest.skip("the sm90 family runs on Hopper only")
    # Aligned tiles straddle the variable blocks: their spans carry row restrictions.
    reg = regime_from_name(name).with_(wide_steps=wide, combine_threshold=0.0, align_tiles=True)
    monkeypatch.setattr(tessera.config, "persistent_grid_cap", 7)
    rng = np.random.default_rng(d + reg.block_m + reg.num_warps + wide)
    qs = np.r_[rng.integers(40, 300, size=6), 20, 24, 512, 500, 100]
    ks = np.r_[rng.integers(30, 250, size=12), 77]
    nq, nk = qs.size, ks.size
    dense = rng.random((2, nq, nk)) < 0.4
    dense[:, :, -1] = False  # the last key block: no query selects it (poisoned below)
    dense[:, 8] = np.arange(nk) < nk - 1  # every other key: one span, ending mid-step
    dense[:, 9] = (np.arange(nk) >= 3) & (np.arange(nk) < 7)  # a band: one span
    dense[0, 10] = False  # a tile over the band's last rows and these: one restricted span
    dense[1, 10] = dense[1, 8]
    m = tessera.BlockMask.from_dense(dense, q_bounds=np.r_[0, np.cumsum(qs)],
                                     kv_bounds=np.r_[0, np.cumsum(ks)])
    p = tessera.plan(m, num_q_heads=4, num_kv_heads=2, head_dim=d, dtype="float16",
                     regime=reg)
    queue = p.launch_queue
    tasks = cp.asnumpy(queue.tasks)
    whole = whole_span_tasks(tasks, cp.asnumpy(queue.spans))
    one_span = tasks[:, Task.SPAN_END] - tasks[:, Task.SPAN_BEGIN] == 1
    assert whole.any() and (~one_span).any() and (one_span & ~whole).any(), \
        "the launch lacks whole-span, several-span or restricted one-span tasks: test is void"
    lq, lk = int(m.seq_len_q), int(m.seq_len_kv)
    q = rng.standard_normal((1, 4, lq, d)).astype(np.float16)
    k, v = (rng.standard_normal((1, 2, lk, d)).astype(np.float16) for _ in range(2))
    ref_out, ref_lse = reference.attention(q, k, v, m, return_lse=True)
    last = slice(lk - int(ks[-1]), lk)
    k[:, :, last], v[:, :, last] = np.nan, np.inf
    v[:, 1, last] = np.nan
    monkeypatch.setattr(tessera.config, "poison_outputs", True)
    out, lse = p.run(cp.asarray(q), cp.asarray(k), cp.asarray(v), return_lse=True)
    got = _to_numpy(out).astype(np.float64)
    assert not np.isnan(got).any(), "output has NaN (unwritten or broken)"
    assert_rows_close(got, ref_out, "float16")
    gl = _to_numpy(lse)
    assert np.array_equal(np.isneginf(gl), np.isneginf(ref_lse))
    fin = np.isfinite(ref_lse)
    assert np.abs(gl[fin] - ref_lse[fin]).max(initial=0) < 2e-2


def _poisoned_run_matches_reference(p, m, q, k, v, monkeypatch):
    """Run plan ``p`` of mask ``m`` on host fp16 ``q, k, v`` with poisoned outputs: every
    element written, every row within fp16's tolerance of the float64 reference, the LSE
    too. Returns the reference output."""
    import cupy as cp

    ref_out, ref_lse = reference.attention(q, k, v, m, return_lse=True)
    monkeypatch.setattr(tessera.config, "poison_outputs", True)
    out, lse = p.run(cp.asarray(q), cp.asarray(k), cp.asarray(v), return_lse=True)
    got = _to_numpy(out).astype(np.float64)
    assert not np.isnan(got).any(), "output has NaN (unwritten or broken)"
    assert_rows_close(got, ref_out, "float16")
    assert np.abs(_to_numpy(lse) - ref_lse).max() < 2e-2
    return ref_out


@pytest.mark.parametrize("name,d,tma", [
    ("sm90_128x128_w12_s3", 128, True), ("sm90_128x128_w12_s3", 128, False),
    ("sm90_192x128_w16_s3", 64, True), ("sm90_192x128_w16_s3", 64, False),
    ("sm90_64x64_w20_s3", 64, True), ("sm90_64x128_w8_s3", 128, True),
    ("sm90_64x64_w8_s3", 64, True), ("sm90_128x128_w12_s3[wide_steps=True]", 64, True)])
def test_plans_of_masks_selecting_every_block(name, d, tma, monkeypatch):
    """Regime.whole_spans: every task walked as one span over all its rows (TESSERA_WHOLE_TASKS)
    on masks that select every block -- variable blocks ending mid-step, a ragged end, GQA, two
    batches, several tasks a CTA -- in both copy forms; against the float64 reference, every
    output written, LSE too. A dense host mask's own plan takes the flag; a device mask's given
    one is not replannable, and a mask leaving one block out is refused."""
    import cupy as cp

    from tessera.runtime.regime import regime_from_name
    from tessera.runtime.tasks import whole_span_tasks

    if _device_cc() != 90:
        pytest.skip("the sm90 family runs on Hopper only")
    monkeypatch.setattr(tessera.config, "persistent_grid_cap", 5)
    monkeypatch.setattr(tessera.config, "use_tma", tma)
    reg = regime_from_name(name).with_(combine_threshold=0.0, whole_spans=True)
    rng = np.random.default_rng(d + reg.block_m + reg.num_warps + tma)
    qs = np.r_[rng.integers(40, 300, size=5), 512, 20]
    ks = np.r_[rng.integers(30, 400, size=7), 77]
    m = tessera.BlockMask.from_dense(np.ones((2, qs.size, ks.size), bool),
                                     q_bounds=np.r_[0, np.cumsum(qs)],
                                     kv_bounds=np.r_[0, np.cumsum(ks)])
    lq, lk = int(m.seq_len_q), int(m.seq_len_kv)
    p = tessera.plan(m, num_q_heads=4, num_kv_heads=2, head_dim=d, dtype="float16", batch=2,
                     regime=reg)
    assert whole_span_tasks(p.queue.tasks, p.queue.spans).all()
    q = rng.standard_normal((2, 4, lq, d)).astype(np.float16)
    k, v = (rng.standard_normal((2, 2, lk, d)).astype(np.float16) for _ in range(2))
    ref_out = _poisoned_run_matches_reference(p, m, q, k, v, monkeypatch)
    # A dense host mask's own plan takes the flag at head dim 128 (uniform blocks: variable
    # ones take aligned tiles); on the device, given: no replan.
    uniform = tessera.BlockMask.from_dense(np.ones((2, 8, 9), bool), block_size=128,
                                           seq_len_kv=1100)
    own = tessera.plan(uniform, num_q_heads=4, num_kv_heads=2, head_dim=d, arch=90)
    assert own.regime.whole_spans == (d == 128)
    dm = tessera.BlockMask.from_dense(cp.ones((2, qs.size, ks.size), bool),
                                      q_bounds=m.q_bounds, kv_bounds=m.kv_bounds)
    dp = tessera.plan(dm, num_q_heads=4, num_kv_heads=2, head_dim=d, dtype="float16",
                      batch=2, regime=reg)
    assert not dp.replannable
    out2 = dp.run(cp.asarray(q), cp.asarray(k), cp.asarray(v))
    assert_rows_close(_to_numpy(out2).astype(np.float64), ref_out, "float16")
    holes = cp.ones((2, qs.size, ks.size), bool)
    holes[1, 2, 3] = False
    with pytest.raises(ValueError, match="select every block only"):
        tessera.plan(tessera.BlockMask.from_dense(holes, q_bounds=m.q_bounds,
                                                  kv_bounds=m.kv_bounds),
                     num_q_heads=4, num_kv_heads=2, head_dim=d, dtype="float16", regime=reg)


@pytest.mark.parametrize("name,d,tma", [
    ("sm90_128x128_w12_s3[combine_threshold=0.0,whole_spans=True]", 128, True),
    ("sm90_128x128_w12_s3", 128, False),
    ("sm90_192x128_w16_s3", 64, True), ("sm80_128x64_w4_s2", 64, False)])
def test_a_filled_last_wave(name, d, tma, monkeypatch):
    """tasks.fill_last_wave on the GPU: the equal tasks of a dense host mask (40, or 28 of 192
    rows), fewer than the GPU's task slots, each cut by key chunks into parts (a ragged key end
    in the last) whose partials the combine step merges; float64 reference, every output
    written, the worst row, LSE."""
    from tessera.runtime.queue import Task
    from tessera.runtime.regime import regime_from_name

    if _device_cc() != 90 and name.startswith("sm90"):
        pytest.skip("the sm90 family runs on Hopper only")
    monkeypatch.setattr(tessera.config, "use_tma", tma)
    reg = regime_from_name(name).with_(combine_threshold=0.0, min_split_chunks=4)
    m = tessera.BlockMask.from_dense(np.ones((1, 20, 40), bool), block_size=(128, 128),
                                     seq_len_q=20 * 128 - 37, seq_len_kv=40 * 128 - 50)
    lq, lk = int(m.seq_len_q), int(m.seq_len_kv)
    p = tessera.plan(m, num_q_heads=2, head_dim=d, dtype="float16", regime=reg,
                     arch=_device_cc())
    if p.in_flight < 80:
        pytest.skip(f"{p.in_flight} task slots: 40 tasks would fill over half of them")
    # Every task (a tile for each head) cut: its parts all write partials.
    assert p.queue.combine.shape[0] == 2 * p.tiles.num_tiles
    assert (_to_numpy(p.queue.tasks)[:, Task.SLOT] >= 0).all()
    rng = np.random.default_rng(d + reg.block_m)
    q, k, v = (rng.standard_normal((1, 2, n, d)).astype(np.float16) for n in (lq, lk, lk))
    _poisoned_run_matches_reference(p, m, q, k, v, monkeypatch)


@pytest.mark.parametrize("d", [64, 128])
def test_a_dense_device_mask_planned_directly_as_a_host_one(d, monkeypatch):
    """tessera.plan of a device mask selecting every block counts its blocks (one scalar back)
    and plans it as the same host mask's plan for this GPU: 192-row tiles at head dim 64, whole
    spans at 128, the last wave filled (40 equal tasks, fewer than the slots) -- queue for
    queue, and against the float64 reference with every output written. A request of the same
    mask counts nothing and keeps its sync-free plan."""
    import cupy as cp

    from tessera.runtime.regime import heuristic as H

    if _device_cc() != 90:
        pytest.skip("the count picks sm90 tiles")
    blocks = np.ones((1, 20, 40), bool)
    geo = dict(block_size=128, seq_len_q=20 * 128 - 37, seq_len_kv=40 * 128 - 50)
    m = tessera.BlockMask.from_dense(blocks, **geo)
    dm = tessera.BlockMask.from_dense(cp.asarray(blocks), **geo)
    kw = dict(num_q_heads=2, head_dim=d, dtype="float16")
    p = tessera.plan(dm, **kw)
    host = tessera.plan(m, arch=90, **kw)
    assert p.regime == host.regime
    assert p.regime.whole_spans if d == 128 else p.regime == H.SM90_ROWS192_D64
    assert not p.sync_free and host.queue.num_slots > 0  # the filled wave
    for name in ("tasks", "spans", "combine"):
        np.testing.assert_array_equal(_to_numpy(getattr(p.queue, name)),
                                      getattr(host.queue, name), err_msg=name)
    rng = np.random.default_rng(d)
    lq, lk = int(m.seq_len_q), int(m.seq_len_kv)
    q, k, v = (rng.standard_normal((1, 2, n, d)).astype(np.float16) for n in (lq, lk, lk))
    _poisoned_run_matches_reference(p, m, q, k, v, monkeypatch)
    monkeypatch.setattr(api, "request_plans", PlanCache())
    monkeypatch.setattr(tessera.BlockMask, "nnz",
                        property(lambda mask: pytest.fail("a request counted the blocks")))
    fresh = tessera.BlockMask.from_dense(cp.asarray(blocks), **geo)
    out = tessera.attention(cp.asarray(q), cp.asarray(k), cp.asarray(v), fresh)
    (kept,) = api.request_plans.plans()
    assert not kept.regime.whole_spans and kept.regime.block_m != 192
    assert_rows_close(_to_numpy(out).astype(np.float64),
                      reference.attention(q, k, v, m), "float16")


def test_a_launch_past_the_task_index_limit_is_refused(monkeypatch):
    """A plan whose task indices (with a persistent grid's surplus tickets) would pass
    launch.MAX_TASKS -- the sm90 producer packs an index and two flags into one int -- is
    refused with a ValueError before anything is launched; one within it runs."""
    import cupy as cp

    m = tessera.BlockMask.from_dense(np.ones((1, 4, 4), bool), q_bounds=np.arange(0, 513, 128),
                                     kv_bounds=np.arange(0, 513, 128))
    rng = np.random.default_rng(5)
    q, k, v = (cp.asarray(rng.standard_normal((1, 2, 512, 64)), dtype=cp.float16)
               for _ in range(3))
    p = tessera.plan(m, num_q_heads=2, head_dim=64, dtype="float16")
    p.run(q, k, v)
    monkeypatch.setattr(launch, "MAX_TASKS", p.launch_queue.num_tasks - 1)
    with pytest.raises(ValueError, match="a launch takes at most"):
        p.run(q, k, v)


@pytest.mark.parametrize("block_m,block_n", [(128, 128), (128, 64), (64, 64), (192, 64)])
@pytest.mark.parametrize("d", [64, 96, 128])
def test_tma_copies_equal_cp_async(d, block_m, block_n, monkeypatch):
    """The producer's TMA copies give the cp.async variant's output bit for bit (rows past a
    span's end hold other keys or zeros instead of the last key: masked either way), with GQA
    packing, variable blocks and a ragged end; operands TMA cannot describe (a token stride
    that is not a multiple of 16 bytes) fall back to cp.async."""
    import cupy as cp

    if _device_cc() != 90:
        pytest.skip("the sm90 family runs on Hopper only")
    if block_m == 192 and d == 128:
        pytest.skip("192-row tiles build at head dims 64 and 96")
    rng = np.random.default_rng(d + block_m + block_n)
    qs, ks = rng.integers(16, 300, size=7), rng.integers(8, 200, size=20)
    dense = rng.random((2, 7, 20)) < 0.4
    m = tessera.BlockMask.from_dense(dense, q_bounds=np.r_[0, np.cumsum(qs)],
                                     kv_bounds=np.r_[0, np.cumsum(ks)])
    reg = Regime(family="sm90", block_m=block_m, num_warps=block_m // 16 + 4, block_n=block_n,
                 stages=3, combine_threshold=0.0)
    lq, lk = int(m.seq_len_q), int(m.seq_len_kv)
    q = cp.asarray(rng.standard_normal((1, 4, lq, d)), dtype=cp.float16)
    k, v = (cp.asarray(rng.standard_normal((1, 2, lk, d)), dtype=cp.float16) for _ in range(2))
    p = tessera.plan(m, num_q_heads=4, num_kv_heads=2, head_dim=d, dtype="float16", regime=reg)
    assert launch._tma_maps(p, operands.describe(q, k, v, "bhld"), False) is not None
    with_tma = p.run(q, k, v)
    monkeypatch.setattr(tessera.config, "use_tma", False)
    without = p.run(q, k, v)
    assert cp.array_equal(with_tma, without)
    _check(m, hq=4, hkv=2, d=d, regime=reg, dtype="float16")  # and against the reference
    monkeypatch.setattr(tessera.config, "use_tma", True)
    # k and v broadcast over the kv heads (a head stride of 0, which cp.async reads and a
    # tensor map cannot describe)
    base = cp.asarray(rng.standard_normal((2, 1, 1, lk, d)), dtype=cp.float16)
    k2, v2 = (cp.lib.stride_tricks.as_strided(base[i], shape=(1, 2, lk, d),
                                              strides=(lk * d * 2, 0, d * 2, 2)) for i in (0, 1))
    assert launch._tma_maps(p, operands.describe(q, k2, v2, "bhld"), False) is None
    ref = reference.attention(q, k2, v2, m)
    got = cp.asnumpy(p.run(q, k2, v2)).astype(np.float64)
    assert np.linalg.norm(got - ref) / np.linalg.norm(ref) <= TOL["float16"]


@pytest.mark.parametrize("tma", [True, False])
@pytest.mark.parametrize("family,block_m,wide", [("sm90ws", 128, False), ("sm90ws", 128, True),
                                                 ("sm90ws", 64, False), ("sm90ws", 192, False),
                                                 ("sm80", 128, False)])
def test_non_finite_values_stay_where_they_belong(family, block_m, wide, tma, monkeypatch):
    """Inf and NaN in the K/V rows of key blocks no query selects -- which partial chunks copy
    past a span's end -- change nothing (0 x Inf never reaches an output); a NaN query row gives
    NaN in that row only. Variable blocks, so most chunks end inside a span's last step."""
    import cupy as cp

    reg = _regime(family, block_m, combine_threshold=0.0)
    if wide:
        reg = reg.with_(wide_steps=True)
    monkeypatch.setattr(tessera.config, "use_tma", tma)
    rng = np.random.default_rng(block_m + 2 * wide + tma)
    qs, ks = rng.integers(16, 300, size=6), rng.integers(8, 200, size=24)
    dense = rng.random((2, 6, 24)) < 0.5
    unselected = np.arange(1, 24, 2)  # every other key block: never selected, by any head
    dense[:, :, unselected] = False
    dense[:, :, 0] = True
    m = tessera.BlockMask.from_dense(dense, q_bounds=np.r_[0, np.cumsum(qs)],
                                     kv_bounds=np.r_[0, np.cumsum(ks)])
    kb = np.r_[0, np.cumsum(ks)]
    rows = np.concatenate([np.arange(kb[i], kb[i + 1]) for i in unselected])
    lq, lk, d = int(m.seq_len_q), int(m.seq_len_kv), 64
    q, k, v = (rng.standard_normal((1, 2, n, d)).astype(np.float16) for n in (lq, lk, lk))
    ref = reference.attention(q, k, v, m)
    poisoned_k, poisoned_v = k.copy(), v.copy()
    poisoned_k[:, :, rows] = np.nan
    poisoned_v[:, :, rows[0::3]] = np.inf
    poisoned_v[:, :, rows[1::3]] = -np.inf
    poisoned_v[:, :, rows[2::3]] = np.nan
    gq = cp.asarray(q)
    gq[0, 1, 5] = np.nan  # one query row of head 1
    out = tessera.attention(gq, cp.asarray(poisoned_k), cp.asarray(poisoned_v), m, regime=reg)
    got = cp.asnumpy(out).astype(np.float64)
    assert np.isnan(got[0, 1, 5]).all(), "a NaN query row gives NaN"
    keep = np.ones(got.shape[:3], dtype=bool)
    keep[0, 1, 5] = False
    assert np.isfinite(got[keep]).all(), "a non-finite value leaked into another row"
    assert_rows_close(got[keep][None], ref[keep][None], "float16")


@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("family,block_m,tma,align", [
    ("sm90ws", 128, True, False), ("sm90ws", 128, False, False), ("sm90ws", 128, True, True),
    ("sm90ws", 64, True, False), ("sm90", 128, False, False), ("sm80", 128, False, False),
    ("sm80", 128, False, True)])
def test_non_finite_values_of_keys_other_rows_select(family, block_m, tma, align, d,
                                                     monkeypatch):
    """Tiles whose rows select different keys (short query blocks combined onto one tile, or
    aligned tiles straddling variable blocks): Inf, -Inf and NaN values -- and a NaN key -- in
    key blocks that some of a tile's rows select leave its other rows exact, and give the rows
    that select them non-finite values exactly where the float64 reference does."""
    import cupy as cp

    rng = np.random.default_rng(block_m + 2 * tma + 4 * align + d)
    m, policy, q, k, v = poisoned_restricted_case(rng, block_m, align, d)
    reg = _regime(family, block_m, **policy)
    monkeypatch.setattr(tessera.config, "use_tma", tma)
    p = tessera.plan(m, num_q_heads=2, head_dim=d, dtype="float16", regime=reg)
    assert p.tiles.num_merged > 0, "no tile's rows select different keys: the test is void"
    ref = reference.attention(q, k, v, m)
    got = cp.asnumpy(p.run(cp.asarray(q), cp.asarray(k), cp.asarray(v))).astype(np.float64)
    rows = assert_same_non_finite(got, ref)
    assert_rows_close(got[rows][None], ref[rows][None], "float16")


@pytest.mark.parametrize("d,bn,pack,tma", [(128, 64, False, True), (128, 64, True, False),
                                           (64, 128, False, True), (64, 128, False, False),
                                           (64, 128, True, False)])
def test_two_64_row_producer_ctas_an_sm(d, bn, pack, tma, monkeypatch):
    """64-row producer tiles that run two CTAs an SM: 64x64 at head dim 128 (one Q buffer) and
    64x128 at head dim 64 (two Q buffers; head dim 64's default), neither with alignment slack
    in shared memory (SMEM_ALIGNED): ragged 64-token blocks, an empty row, GQA, more tasks than
    CTAs; TMA copies or cp.async (packed keys, or TMA switched off)."""
    from tessera.cuda.loader import blocks_per_sm, smem_bytes

    if _device_cc() != 90:
        pytest.skip("the sm90 family runs on Hopper only")
    reg = Regime(family="sm90", block_m=64, block_n=bn, num_warps=8, stages=3,
                 combine_threshold=0.0, pack_keys=pack)
    v = reg.variant(d, bf16=True, tma=tma)
    assert dict(v.macros).get("SMEM_ALIGNED") == 1 and v.min_blocks == 2
    assert blocks_per_sm(v) == 2, f"{smem_bytes(v)} bytes of shared memory"
    monkeypatch.setattr(tessera.config, "persistent_grid_cap", 5)  # several tasks per CTA
    monkeypatch.setattr(tessera.config, "use_tma", tma)
    rng = np.random.default_rng(d + bn + pack + 2 * tma)
    sizes = np.r_[rng.integers(40, 65, size=14), 64, 17]
    bounds = np.r_[0, np.cumsum(sizes)]
    dense = rng.random((4, sizes.size, sizes.size)) < 0.3
    dense[:, 2, :] = False  # an empty row
    m = tessera.BlockMask.from_dense(dense, q_bounds=bounds, kv_bounds=bounds)
    _check(m, hq=8, hkv=4, d=d, regime=reg)
    _check(m, hq=8, hkv=4, d=d, regime=reg, dtype="float16", seed=1)


@pytest.mark.parametrize("cap", [None, 1, 2, 0])
@pytest.mark.parametrize("rings,d,bn,combine", [(4, 64, 64, 0.0), (4, 64, 64, 0.3),
                                                (3, 64, 64, 0.0), (2, 64, 128, 0.0),
                                                (2, 128, 64, 0.3)])
def test_rings_of_64_row_tasks(rings, d, bn, combine, cap, monkeypatch):
    """A CTA of 2-4 rings (64-row tiles, TMA): each consumer warpgroup on its own tasks, Q
    buffers and stage ring, fed by its own producer warp, all rings taking tasks from one
    counter. Against the one-ring variant of the same plan bit for bit, and against the
    reference: ragged 64-token blocks, an empty row, GQA, combined rows (0.3), grids of one CTA
    (its rings taking every task), two, one a ring's first task (cap 0) and the GPU's."""
    import cupy as cp

    if _device_cc() != 90:
        pytest.skip("the sm90 family runs on Hopper only")
    reg = Regime(family="sm90", block_m=64, block_n=bn, num_warps=4 * rings + 4, stages=3,
                 combine_threshold=combine)
    v = reg.variant(d, bf16=True, tma=True)
    assert v.rings == rings and v.threads == 128 * (rings + 1)
    assert reg.variant(d, bf16=True).rings == 1  # (cp.async: one ring)
    monkeypatch.setattr(tessera.config, "persistent_grid_cap", cap)
    rng = np.random.default_rng(rings + d + bn + int(10 * combine) + (cap or 0))
    sizes = np.r_[rng.integers(20, 65, size=13), 64, 17]
    bounds = np.r_[0, np.cumsum(sizes)]
    dense = rng.random((4, sizes.size, sizes.size)) < 0.3
    dense[:, 2, :] = False  # an empty row
    m = tessera.BlockMask.from_dense(dense, q_bounds=bounds, kv_bounds=bounds)
    p = tessera.plan(m, num_q_heads=8, num_kv_heads=4, head_dim=d, dtype="float16",
                     regime=reg)
    assert p.queue.num_tasks > 2 * rings
    one = tessera.plan(m, num_q_heads=8, num_kv_heads=4, head_dim=d, dtype="float16",
                       regime=reg.with_(num_warps=8))
    q = cp.asarray(rng.standard_normal((1, 8, bounds[-1], d)), dtype=cp.float16)
    k, v_ = (cp.asarray(rng.standard_normal((1, 4, bounds[-1], d)), dtype=cp.float16)
             for _ in range(2))
    assert cp.array_equal(p.run(q, k, v_), one.run(q, k, v_))
    _check(m, hq=8, hkv=4, d=d, regime=reg)
    _check(m, hq=8, hkv=4, d=d, regime=reg, dtype="float16", seed=1)


@pytest.mark.parametrize("family", FAMILIES)
def test_restricted_merge_rows(family):
    d = np.zeros((1, 8, 8), bool)
    for i in range(8):
        d[0, i, max(0, i - 2):i + 2] = True  # a band: neighbours share most keys
    m = tessera.BlockMask.from_dense(d, block_size=64, seq_len_q=500, seq_len_kv=512)
    reg = _regime(family)  # 128-row tiles: two 64-row blocks fit
    p = tessera.plan(m, num_q_heads=1, head_dim=128, regime=reg)
    assert p.tiles.num_merged > 0
    _check(m, hq=1, d=128, regime=reg)


@pytest.mark.parametrize("split", [False, True])
@pytest.mark.parametrize("block_m", [64, 128])
@pytest.mark.parametrize("family", FAMILIES)
def test_aligned_tiles(family, block_m, split):
    """align_tiles: tiles at multiples of block_m tokens straddle variable blocks (clusters of
    40-220 tokens), each span restricted to the rows selecting it; GQA, an empty row, splits."""
    rng = np.random.default_rng(block_m + split)
    qs = rng.integers(40, 220, size=12)
    ks = rng.integers(40, 220, size=12)
    i = np.arange(12)[None, :, None]
    j = np.arange(12)[None, None, :]
    lo, hi = i - 4 - rng.integers(0, 3, (2, 12, 1)), i + 4 + rng.integers(0, 3, (2, 12, 1))
    dense = ((j >= lo) & (j <= hi)) ^ (rng.random((2, 12, 12)) < 0.1)
    dense[:, 6] = False
    policy = dict(split_ratio=1.0, min_split_chunks=2) if split else {}
    reg = _regime(family, block_m, combine_threshold=0.0, align_tiles=True, **policy)
    import cupy as cp

    for blocks in (dense, cp.asarray(dense)):  # planned on the host, and on the device
        m = tessera.BlockMask.from_dense(blocks, q_bounds=np.r_[0, np.cumsum(qs)],
                                         kv_bounds=np.r_[0, np.cumsum(ks)])
        p = tessera.plan(m, num_q_heads=4, num_kv_heads=2, head_dim=128, regime=reg)
        assert p.tiles.num_merged > 0 and (p.queue.combine.shape[0] > 0) == split
        _check(m, hq=4, hkv=2, d=128, regime=reg)


def test_aligned_tiles_chosen_for_a_device_mask(monkeypatch):
    """Variable clusters whose neighbours share keys, as a device mask: the default plan on
    sm_90 aligns its 128-row tiles (one synchronization for the estimate), the planner kernels
    build them, and the answer matches the reference."""
    import cupy as cp

    if _device_cc() != 90:
        pytest.skip("the aligned default is the sm90 heuristic's")
    rng = np.random.default_rng(11)
    n = 24
    qb = np.r_[0, np.cumsum(rng.integers(100, 200, n))]
    i, j = np.arange(n)[None, :, None], np.arange(n)[None, None, :]
    near = np.abs(j - i) <= 6 + rng.integers(0, 2, (2, n, 1))
    m = tessera.BlockMask.from_dense(cp.asarray(near), q_bounds=qb, kv_bounds=qb)
    # The heuristic's choice: a mask this small may split its tasks, where a regime table in
    # force would be asked first (use_table(None), undone after the test).

    monkeypatch.setattr(tessera.runtime.regime.selection, "_explicit", None)
    p = tessera.plan(m, num_q_heads=2, head_dim=64)
    assert p.regime.align_tiles and p.regime.block_m == 128 and p.tiles.num_merged > 0
    _check(m, hq=2, d=64)


def test_tiling_pairs_of_a_device_mask():
    """The tilings' pair estimate reads a device mask's selection as it reads the host's."""
    import cupy as cp

    from tessera.runtime.mapping import tiling_pairs
    from tessera.runtime.regime import align_pays

    rng = np.random.default_rng(11)
    n = 24
    qb = np.r_[0, np.cumsum(rng.integers(100, 200, n))]
    i, j = np.arange(n)[None, :, None], np.arange(n)[None, None, :]
    near = np.abs(j - i) <= 6 + rng.integers(0, 2, (2, n, 1))
    host = tessera.BlockMask.from_dense(near, q_bounds=qb, kv_bounds=qb)
    dev = tessera.BlockMask.from_dense(cp.asarray(near), q_bounds=qb, kv_bounds=qb)
    assert tiling_pairs(dev, 128) == tiling_pairs(host, 128)
    assert align_pays(dev, 128) and align_pays(host, 128)


def test_key_walk_chunks_of_a_device_mask(monkeypatch):
    """The key walks' chunk counts read a device mask's selection (plan_row_stats, span by span
    and packed) as the host's arrays do; the packed regime it selects runs correctly."""
    import cupy as cp

    if _device_cc() != 90:
        pytest.skip("the packed default is the sm90 heuristic's")

    from tessera.runtime.mapping import key_walk_chunks
    from tessera.runtime.regime import pack_pays

    rng = np.random.default_rng(12)
    n = 120  # (enough blocks for the 10% mask's spans to cost the packing's ~1.27x)
    b = np.r_[0, np.cumsum(rng.integers(32, 257, n))]
    sel = rng.random((2, n, n)) < 0.1
    host = tessera.BlockMask.from_dense(sel, q_bounds=b, kv_bounds=b)
    dev = tessera.BlockMask.from_dense(cp.asarray(sel), q_bounds=b, kv_bounds=b)
    for bn, rows in ((128, 128), (64, 64)):
        assert key_walk_chunks(dev, bn, rows) == key_walk_chunks(host, bn, rows)
    assert pack_pays(dev, 128, 128) and pack_pays(host, 128, 128)
    # The heuristic's choice: a mask this small may split its tasks, where a regime table in
    # force would be asked first (no table for this test).
    monkeypatch.setattr(tessera.runtime.regime.selection, "_explicit", None)
    assert tessera.plan(dev, num_q_heads=2, head_dim=128).regime.pack_keys
    _check(dev, hq=2, d=128)


@pytest.mark.parametrize("family", FAMILIES)
def test_heavy_rows_split_and_combined(family):
    rng = np.random.default_rng(7)
    dense = rng.random((2, 12, 40)) < 0.05
    dense[:, 3, :] = True
    dense[:, 7, :30] = True
    m = tessera.BlockMask.from_dense(dense, block_size=64, seq_len_q=740, seq_len_kv=2500)
    reg = _regime(family, split_ratio=1.5, min_split_chunks=4)
    p = tessera.plan(m, num_q_heads=2, head_dim=128, regime=reg)
    assert p.queue.combine.shape[0] > 0
    for dtype in ("bfloat16", "float16"):
        _check(m, hq=2, d=128, regime=reg, dtype=dtype)


def test_cupy_float16_in_and_out():
    import cupy as cp

    rng = np.random.default_rng(8)
    m = _random_mask(rng, (4, 4), 0.5, block_size=128)
    out = _check(m, fw="cupy", dtype="float16", hq=2)
    assert isinstance(out, cp.ndarray)


def _device_vs_host_masks():
    rng = np.random.default_rng(9)
    band = np.zeros((2, 16, 16), bool)
    for i in range(16):
        band[:, i, max(0, i - 2):i + 2] = True
    variable = dict(q_bounds=np.r_[0, np.cumsum(rng.integers(16, 300, 9))],
                    kv_bounds=np.r_[0, np.cumsum(rng.integers(8, 200, 70))])
    empty = rng.random((3, 9, 70)) < 0.3
    empty[:, 4] = False
    return {
        "random 64": (rng.random((3, 20, 30)) < 0.2, dict(block_size=64)),
        "pairs 64": (np.repeat(rng.random((2, 10, 40)) < 0.3, 2, axis=1), dict(block_size=64)),
        "wide rows": (rng.random((1, 5, 300)) < 0.5, dict(block_size=(384, 16), seq_len_q=1900)),
        "band (restricted merges)": (band, dict(block_size=64)),
        "variable + empty rows": (empty, variable),
        "all": (np.ones((2, 7, 7), bool), dict(block_size=128, seq_len_q=850, seq_len_kv=830)),
        # Over a thousand runs of few distinct costs: the planner's stable sort across several
        # of its 1024-run rounds, ties everywhere.
        "many runs": (rng.random((3, 500, 48)) < 0.06, dict(block_size=64)),
        # More possible costs than plan_scan keeps in shared memory (4096): its global table.
        "many key blocks": (rng.random((1, 4, 4200)) < 0.3, dict(block_size=(128, 16))),
    }


@pytest.mark.parametrize("case", list(_device_vs_host_masks()))
def test_device_planner_equals_host_planner(case):
    import cupy as cp

    dense, geo = _device_vs_host_masks()[case]
    host = tessera.BlockMask.from_dense(dense, **geo)
    dev = tessera.BlockMask.from_dense(cp.asarray(dense), **geo)
    # The same mask arriving as CSR on the device: the planner scatters it to dense rows.
    csr = tessera.BlockMask(host.q_bounds, host.kv_bounds, host.indptr, host.indices,
                            host.batch_heads).to_device()
    assert dev.on_device and csr.on_device and csr.dense_rows is None
    # Threshold 0 takes the planner kernels (device_planner.py): sync-free when no task may
    # split (split_ratio 1e9), else one sync, handing split tasks to the general organization;
    # 0.3 the general path on the device. Aligned tiles too (plan_aligned_spans).
    regimes = [Regime(), Regime(block_m=64), Regime(split_ratio=1.0, min_split_chunks=2)]
    regimes += [r.with_(combine_threshold=0.0) for r in regimes]
    regimes += [Regime(combine_threshold=0.0, align_tiles=True),
                Regime(combine_threshold=0.0, split_ratio=1e9, align_tiles=True),
                Regime(combine_threshold=0.0, split_ratio=1e9),
                Regime(block_m=64, combine_threshold=0.0, split_ratio=1e9)]
    if _device_cc() == 90:  # the packed walk's costs in the planner kernels (never split)
        regimes += [Regime(family="sm90", block_m=bm, num_warps=bm // 16 + 4, block_n=bn,
                           stages=3, combine_threshold=0.0, pack_keys=True)
                    for bm, bn in ((64, 64), (128, 128))]
    h = dense.shape[0]
    for reg in regimes:
        for hq, hkv in ((h, h), (2 * h, h)):  # GQA packs two query heads per mask head
            ph = tessera.plan(host, num_q_heads=hq, num_kv_heads=hkv, head_dim=128, regime=reg,
                              arch=_device_cc())  # both plans for this GPU
            for m in (dev, csr):
                pd = tessera.plan(m, num_q_heads=hq, num_kv_heads=hkv, head_dim=128,
                                  regime=reg)
                assert pd.sync_free == (reg.split_ratio == 1e9 or reg.pack_keys)
                assert isinstance(pd.queue.tasks, cp.ndarray)
                for f in ("tasks", "spans", "combine"):
                    np.testing.assert_array_equal(getattr(ph.queue, f),
                                                  getattr(pd.queue, f).get(), err_msg=f)
                for f in ("mask_bh", "q0", "q1", "span_begin", "span_end", "chunks"):
                    np.testing.assert_array_equal(getattr(ph.tiles, f),
                                                  cp.asnumpy(getattr(pd.tiles, f)), err_msg=f)
                assert pd.tiles.num_merged == ph.tiles.num_merged
    _check(dev, hq=dense.shape[0], d=128)
    _check(csr, hq=dense.shape[0], d=128)
    for reg in regimes[6:10]:  # the aligned and the sync-free ones
        _check(dev, hq=dense.shape[0], d=128, seed=2, regime=reg)
    # Sync-free plans: the kernels take the task count from the device, the grid is a bound.
    for family in ("sm80", "sm90ws"):
        if family == "sm80" or _device_cc() == 90:
            _check(dev, hq=dense.shape[0], d=128, seed=1,
                   regime=_regime(family, combine_threshold=0.0, split_ratio=1e9))


@pytest.mark.parametrize("case", ["random 64", "variable + empty rows", "many runs"])
def test_replan_on_the_device_equals_a_new_plan(case):
    """Plan.replan with the real planner kernels (replayed as a CUDA graph that reads a copy of
    the new mask's rows): a sync-free plan of one mask replanned for another of its geometry
    gives the host plan of the new mask array for array (the kernels overwrite whatever the
    first mask left in the buffers)."""
    import cupy as cp

    dense, geo = _device_vs_host_masks()[case]
    rng = np.random.default_rng(19)
    first = tessera.BlockMask.from_dense(cp.asarray(rng.random(dense.shape) < 0.7), **geo)
    host = tessera.BlockMask.from_dense(dense, **geo)
    dev = tessera.BlockMask.from_dense(cp.asarray(dense), **geo)
    regimes = [Regime(combine_threshold=0.0, split_ratio=1e9),
               Regime(combine_threshold=0.0, split_ratio=1e9, align_tiles=True)]
    if _device_cc() == 90:
        regimes.append(Regime(family="sm90", block_m=128, num_warps=12, block_n=128, stages=3,
                              combine_threshold=0.0, pack_keys=True))
    h = dense.shape[0]
    for reg in regimes:
        p = tessera.plan(first, num_q_heads=2 * h, num_kv_heads=h, head_dim=128, regime=reg)
        assert p.replannable
        _ = p.tiles  # settled for the first mask: the replan must cut them again
        assert p.replan(dev) is p
        assert p.device_plan.relaunch.graph is not None  # replayed as one CUDA graph
        ph = tessera.plan(host, num_q_heads=2 * h, num_kv_heads=h, head_dim=128, regime=reg,
                          arch=_device_cc())
        for f in ("tasks", "spans", "combine"):
            np.testing.assert_array_equal(getattr(ph.queue, f), getattr(p.queue, f).get(),
                                          err_msg=f)
        for f in ("mask_bh", "q0", "q1", "span_begin", "span_end", "chunks"):
            np.testing.assert_array_equal(getattr(ph.tiles, f), cp.asnumpy(getattr(p.tiles, f)),
                                          err_msg=f)


@pytest.mark.parametrize("family", ["sm80", "sm90ws", "default"])
def test_requests_of_one_geometry_reuse_a_plan(monkeypatch, family):
    """tessera.attention keeps a sync-free plan per (geometry, shapes, stream) and replans it for
    the next request's mask: requests of very different masks (sparse, dense, empty rows, a
    heavy row), on two streams in turn, each give the reference output with every element
    written. "default": Wan's shape, where the default plan is sync-free on the H200; checked
    bit for bit against a new plan's run (the float64 reference would take minutes there)."""
    torch = _torch()
    monkeypatch.setattr(api, "request_plans", PlanCache())
    if family == "default":
        h, n, L, regime = 12, 256, 256 * 128, None
    else:
        h, n, L = 2, 10, 1200
        regime = _regime(family, combine_threshold=0.0, split_ratio=1e9)
    rng = np.random.default_rng(20)
    masks = [rng.random((h, n, n)) < 0.3, np.ones((h, n, n), bool),
             rng.random((h, n, n)) < 0.05, rng.random((h, n, n)) < 0.1]
    masks[2][:, 3] = False  # empty rows
    masks[3][0, 1] = True  # a heavy row
    q, k, v = (torch.randn(1, h, L, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    exact = [x.float().cpu().numpy().astype(np.float64) for x in (q, k, v)]
    streams = [torch.cuda.Stream(), torch.cuda.Stream()]
    kept = {}
    for i, host in enumerate(masks * 2):
        s = streams[i % 2]
        with torch.cuda.stream(s):
            mask = tessera.BlockMask.from_dense(torch.from_numpy(host).cuda(), block_size=128,
                                                seq_len_q=L, seq_len_kv=L)
            out = tessera.attention(q, k, v, mask, regime=regime)
        s.synchronize()
        assert not torch.isnan(out).any(), f"request {i}: unwritten output"
        if family == "default":
            # (mode=PlanMode.REQUEST: the request's own selection, which counts no blocks)
            new = tessera.plan(mask, num_q_heads=h, head_dim=64,
                               mode=PlanMode.REQUEST).run(q, k, v)
            torch.testing.assert_close(out, new, rtol=0, atol=0)
        else:
            ref = reference.attention(*exact, tessera.BlockMask.from_dense(
                host, block_size=128, seq_len_q=L, seq_len_kv=L))
            err = np.linalg.norm(out.float().cpu().numpy() - ref) / np.linalg.norm(ref)
            assert err < TOL["bfloat16"], f"request {i}: relative error {err:.2e}"
        plans = [p for key, p in zip(api.request_plans.keys(), api.request_plans.plans())
                 if key.stream == s.cuda_stream]
        if family != "default" or plans:
            assert len(plans) == 1 and plans[0].mask is mask
            assert kept.setdefault(s.cuda_stream, plans[0]) is plans[0]  # the same plan
            assert (plans[0].device_plan.relaunch.graph is not None) == (i >= 2)  # replans
    assert len(kept) == 2 or (family == "default" and _device_cc() != 90)


def test_torch_zero_copy_and_type():
    torch = _torch()
    rng = np.random.default_rng(10)
    m = _random_mask(rng, (4, 4), 0.5, block_size=128)
    q = torch.randn(1, 2, 512, 64, device="cuda", dtype=torch.bfloat16)
    desc = tessera.interop.from_any(q, "q")
    assert desc.ptr == q.data_ptr()
    out = tessera.attention(q, q, q, m)
    assert isinstance(out, torch.Tensor) and out.device == q.device and out.dtype == q.dtype


def test_torch_runs_on_current_stream():
    torch = _torch()
    rng = np.random.default_rng(11)
    m = _random_mask(rng, (8, 8), 0.5, block_size=128)
    s = torch.cuda.Stream()
    q = torch.randn(1, 2, 1024, 64, device="cuda", dtype=torch.bfloat16)
    with torch.cuda.stream(s):
        out = tessera.attention(q, q, q, m)
    s.synchronize()
    ref = reference.attention(*(q.float().cpu().numpy(),) * 3, m)
    err = np.linalg.norm(out.float().cpu().numpy() - ref) / np.linalg.norm(ref)
    assert err < 1e-2


def test_jax_in_jax_out():
    jax = pytest.importorskip("jax")
    rng = np.random.default_rng(12)
    m = _random_mask(rng, (4, 4), 0.5, block_size=128)
    out = _check(m, fw="jax", dtype="bfloat16", hq=2)
    assert isinstance(out, jax.Array)


@pytest.mark.parametrize("scale", [0.02, 0.3])
@pytest.mark.parametrize("family", FAMILIES)
def test_explicit_scale(family, scale):
    """A caller's softmax scale (not 1/sqrt(D)): flat (0.02) and sharp (0.3, where the running
    max moves often) against the reference, output and LSE, on ragged blocks with an empty row
    and partial key chunks."""
    rng = np.random.default_rng(int(scale * 100))
    sizes = np.r_[rng.integers(60, 200, size=9), 37]
    bounds = np.r_[0, np.cumsum(sizes)]
    dense = rng.random((2, sizes.size, sizes.size)) < 0.4
    dense[:, 3] = False
    m = tessera.BlockMask.from_dense(dense, q_bounds=bounds, kv_bounds=bounds)
    _check(m, hq=4, hkv=2, d=64, regime=_regime(family), scale=scale)
    _check(m, hq=2, d=128, regime=_regime(family), scale=scale, dtype="float16", seed=1)


def test_validation_errors():
    torch = _torch()
    rng = np.random.default_rng(13)
    m = _random_mask(rng, (4, 4), 0.5, block_size=128)
    q = torch.randn(1, 2, 512, 64, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(TypeError, match="q must be bfloat16 or float16"):
        tessera.attention(q.float(), q, q, m)
    with pytest.raises(ValueError, match="head dim 80"):
        x = torch.randn(1, 2, 512, 80, device="cuda", dtype=torch.bfloat16)
        tessera.attention(x, x, x, m)
    with pytest.raises(ValueError, match="block_mask covers"):
        x = torch.randn(1, 2, 500, 64, device="cuda", dtype=torch.bfloat16)
        tessera.attention(x, x, x, m)
    with pytest.raises(ValueError, match="contiguous in the head dim"):
        x = torch.randn(1, 2, 64, 512, device="cuda", dtype=torch.bfloat16).transpose(2, 3)
        tessera.attention(x, x, x, m)
    with pytest.raises(ValueError, match="host"):
        tessera.attention(np.zeros((1, 2, 512, 64)), q, q, m)
    with pytest.raises(ValueError, match="multiple of k/v heads"):
        x = torch.randn(1, 3, 512, 64, device="cuda", dtype=torch.bfloat16)
        tessera.attention(x, q, q, m)
    with pytest.raises(TypeError, match="share a dtype"):
        tessera.attention(q, q.half(), q.half(), m)
    with pytest.raises(TypeError, match="block_mask"):
        tessera.attention(q, q, q, m.to_dense())


def test_device_mask_on_a_side_stream():
    """Planning on the device and running on a PyTorch side stream: the kernels must see the
    finished plan (attention plans on the caller's stream; a plan made elsewhere is waited for
    through an event)."""
    torch = _torch()
    rng = np.random.default_rng(14)
    blocks = torch.from_numpy(rng.random((2, 24, 24)) < 0.3).cuda()
    q, k, v = (torch.randn(1, 2, 3000, 64, device="cuda", dtype=torch.bfloat16)
               for _ in range(3))
    ref = reference.attention(*(x.float().cpu().numpy() for x in (q, k, v)),
                              tessera.BlockMask.from_dense(blocks.cpu().numpy(), block_size=128,
                                                           seq_len_q=3000, seq_len_kv=3000))
    s = torch.cuda.Stream()
    for _ in range(3):
        with torch.cuda.stream(s):
            m = tessera.BlockMask.from_dense(blocks, block_size=128, seq_len_q=3000,
                                             seq_len_kv=3000)
            out1 = tessera.attention(q, k, v, m)
            p = tessera.plan(m, num_q_heads=2, head_dim=64)
        with torch.cuda.stream(torch.cuda.Stream()):
            out2 = p.run(q, k, v)
        torch.cuda.synchronize()
        for out in (out1, out2):
            got = out.float().cpu().numpy()
            assert np.linalg.norm(got - ref) / np.linalg.norm(ref) < 1e-2


def test_run_into_given_outputs():
    """Plan.run(out=, lse=) writes caller-owned (NaN-poisoned, strided) buffers in place."""
    torch = _torch()
    rng = np.random.default_rng(15)
    m = _random_mask(rng, (2, 6, 6), 0.4, block_size=128, seq_len_q=700, seq_len_kv=700)
    q, k, v = (torch.randn(1, 700, 2, 64, device="cuda", dtype=torch.bfloat16)
               for _ in range(3))  # blhd
    p = tessera.plan(m, num_q_heads=2, head_dim=64, layout="blhd")
    big = torch.full((1, 700, 2, 128), float("nan"), device="cuda", dtype=torch.bfloat16)
    out = big[..., 32:96]  # a strided view: row stride 256 elements
    lse = torch.full((1, 2, 700), float("nan"), device="cuda", dtype=torch.float32)
    res_out, res_lse = p.run(q, k, v, out=out, lse=lse)
    assert res_out is out and res_lse is lse
    ref, ref_lse = reference.attention(*(x.float().cpu().numpy() for x in (q, k, v)), m,
                                       return_lse=True, layout="blhd")
    got = out.float().cpu().numpy()
    assert not np.isnan(got).any()
    assert np.linalg.norm(got - ref) / np.linalg.norm(ref) < 1e-2
    assert torch.isnan(big[..., :32]).all() and torch.isnan(big[..., 96:]).all()  # untouched
    gl = lse.cpu().numpy()
    fin = np.isfinite(ref_lse)
    assert np.array_equal(np.isneginf(gl), np.isneginf(ref_lse))
    assert np.abs(gl[fin] - ref_lse[fin]).max() < 2e-2
    with pytest.raises(ValueError, match="out must have shape"):
        p.run(q, k, v, out=big)
    with pytest.raises(ValueError, match="lse must be"):
        p.run(q, k, v, lse=lse[:, :1])


def test_sm90_regime_is_refused_off_hopper():
    """A plan made for the Hopper family says so on any other GPU, before launching."""
    if _device_cc() == 90:
        pytest.skip("this is a Hopper GPU")
    import cupy as cp

    m = _random_mask(np.random.default_rng(2), (1, 2, 2), 1.0, block_size=128)
    q = cp.zeros((1, 1, 256, 128), dtype=cp.float16)
    reg = Regime(family="sm90", block_m=128, num_warps=8, block_n=128, stages=3)
    with pytest.raises(ValueError, match="sm_90 GPUs only"):
        tessera.attention(q, q, q, m, regime=reg)


def test_regime_over_the_shared_memory_limit_is_refused():
    """A tile/stage combination the GPU cannot hold is refused with the numbers, not with a
    driver error."""
    import cupy as cp

    m = _random_mask(np.random.default_rng(3), (1, 2, 2), 1.0, block_size=128)
    q = cp.ones((1, 1, 256, 128), dtype=cp.float16)
    reg = Regime(block_m=128, block_n=64, num_warps=4, stages=8)  # ~290 KB at head dim 128
    with pytest.raises(ValueError, match="shared memory"):
        tessera.attention(q, q, q, m, regime=reg)


@pytest.mark.parametrize("cap", [1, 3, 7])
@pytest.mark.parametrize("d", [64, 128])
def test_persistent_ctas_run_many_tasks(monkeypatch, cap, d):
    """The warp-specialized variant is persistent: with the grid capped at a few CTAs each runs
    a run of tasks back to back (the K/V stage ring and the Q hand-over carry on across them),
    including tasks with no keys, split parts and GQA-packed tiles."""
    monkeypatch.setattr(tessera.config, "persistent_grid_cap", cap)
    reg = _regime("sm90ws", split_ratio=2.0, min_split_chunks=2)
    stress = _regime_stress_mask()
    p = tessera.plan(stress, num_q_heads=4, num_kv_heads=2, head_dim=d, regime=reg)
    assert p.queue.num_tasks > 3 * cap and p.queue.combine.shape[0] > 0
    _check(stress, hq=4, hkv=2, d=d, regime=reg)
    many = _random_mask(np.random.default_rng(d + cap), (3, 16, 20), 0.3, block_size=64,
                        seq_len_q=1000)
    _check(many, hq=3, d=d, regime=reg, dtype="float16")


def test_persistent_kernel_with_one_cta_per_task(monkeypatch):
    """persistent_grid_cap = 0 launches the persistent variant with one CTA per task (each
    finds the queue exhausted after its first task): the same results."""
    monkeypatch.setattr(tessera.config, "persistent_grid_cap", 0)
    reg = _regime("sm90ws", split_ratio=2.0, min_split_chunks=2)
    _check(_regime_stress_mask(), hq=4, hkv=2, d=128, regime=reg)


def test_torch_mask_read_without_copy_and_ordered_on_side_streams():
    """A torch bool block matrix becomes a CuPy view of its memory (no copy) when torch and CuPy
    share a stream; on a torch side stream it goes through DLPack, whose handshake orders the
    mask's producer before CuPy's copy -- the plan then sees the mask as written."""
    torch = _torch()
    from tessera.interop import as_array

    t = torch.rand(2, 6, 6, device="cuda") < 0.5
    view = as_array(t, "mask")
    assert view.data.ptr == t.data_ptr() and view.shape == (2, 6, 6)
    assert (view.get() == t.cpu().numpy()).all()
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        torch.cuda._sleep(50_000_000)  # the producer is late
        late = torch.ones(2, 6, 6, device="cuda", dtype=torch.bool)
        mask = tessera.BlockMask.from_dense(late, block_size=64)
        p = tessera.plan(mask, num_q_heads=2, head_dim=64)
    torch.cuda.synchronize()
    spans = p.queue.spans.get()
    assert len(spans) and ((spans[:, 1] - spans[:, 0]) == 384).all()  # all six key blocks


def test_torch_mask_copied_on_its_stream():
    """A contiguous torch mask on torch's current stream (CuPy's too) is copied straight from
    its memory, after what torch enqueued before it: a late producer's values are the mask's,
    and writing the tensor afterwards does not change the mask (a private copy); a
    non-contiguous one takes the general path to the same mask."""
    torch = _torch()
    t = torch.zeros(2, 6, 6, device="cuda", dtype=torch.bool)
    torch.cuda._sleep(50_000_000)  # the producer is late
    t.fill_(True)
    mask = tessera.BlockMask.from_dense(t, block_size=64)
    t.zero_()  # enqueued after the mask's copy
    torch.cuda.synchronize()
    rows = mask.dense_rows
    assert rows.data.ptr != t.data_ptr() and rows.shape == (12, 6) and bool(rows.all())
    strided = torch.ones(6, 6, 2, device="cuda", dtype=torch.bool).permute(2, 0, 1)
    assert not strided.is_contiguous()
    other = tessera.BlockMask.from_dense(strided, block_size=64)
    assert other.dense_rows.shape == (12, 6) and bool(other.dense_rows.all())


def test_portable_plan_counts_its_slots_by_occupancy():
    """The portable family's one-task CTAs in flight are the driver's occupancy of the compiled
    variant (registers included), not the shared-memory estimate: at CogVideoX's shape (48
    heads x 139 query tiles at head dim 64) the default portable plan is sync-free on the H200
    (6,672 tasks >= 16 x 2 CTAs x 132 SMs; the estimate's 4 CTAs an SM kept it synchronizing on
    every request), and it equals the host planner's plan for this GPU, output for output."""
    import cupy as cp

    from tessera.cuda.loader import blocks_per_sm
    from tessera.cuda import device as D
    from tessera.runtime import regime as R

    h, n, L, d = 48, 139, 17776, 64
    blocks = cp.random.default_rng(5).random((h, n, n)) < 0.1
    geo = dict(block_size=128, seq_len_q=L, seq_len_kv=L)
    mask = tessera.BlockMask.from_dense(blocks, **geo)
    portable = default_regime(80, d)
    slots = R.plan_tasks_in_flight(portable, mask, d, None, bf16=False)
    assert slots == D.device_sm_count() * blocks_per_sm(portable.variant(d, bf16=False))
    assert slots <= R.tasks_in_flight(portable, d, _device_cc(), D.device_sm_count())
    kw = dict(num_q_heads=h, head_dim=d, dtype="float16", regime=portable)
    p = tessera.plan(mask, **kw)
    assert p.sync_free == (h * n >= 16 * slots)
    if _device_cc() == 90:
        assert p.sync_free  # two CTAs an SM of ~230-register threads
    host = tessera.plan(tessera.BlockMask.from_dense(blocks.get(), **geo), arch=_device_cc(),
                        **kw)
    np.testing.assert_array_equal(p.queue.tasks.get(), host.queue.tasks)
    q, k, v = (cp.random.default_rng(i).standard_normal((1, h, L, d), dtype=cp.float32)
               .astype(cp.float16) for i in range(3))
    out = p.run(q, k, v)
    assert not cp.isnan(out).any()
    cp.testing.assert_array_equal(out, host.run(q, k, v))


def test_full_size_request_never_waits_for_the_gpu():
    """At a model's shape (Wan: 12 heads x 256 query blocks, enough tasks per SM that none may
    split) the default plan is sync-free: with the GPU busy for a long while, a new device mask
    is planned and launched and the host gets its output back before the GPU gets to it."""
    torch = _torch()
    h, n, L = 12, 256, 256 * 128
    blocks = torch.rand(h, n, n, device="cuda") < 0.1
    q, k, v = (torch.randn(1, h, L, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    mask = tessera.BlockMask.from_dense(blocks, block_size=128)
    warm = tessera.plan(mask, num_q_heads=h, head_dim=64)  # compiles the kernels
    warm.run(q, k, v)
    assert warm.sync_free or _device_cc() != 90  # the H200: 3072 tasks >= 16 x 132 slots
    if not warm.sync_free:
        pytest.skip("this GPU runs too many tasks at once for this mask to be planned sync-free")
    torch.cuda.synchronize()
    torch.cuda._sleep(2_000_000_000)  # ~1 s of GPU time on the current stream
    busy = torch.cuda.Event()
    busy.record()
    out = tessera.attention(q, k, v, tessera.BlockMask.from_dense(blocks, block_size=128))
    assert not busy.query(), "the request waited for the GPU"
    torch.cuda.synchronize()
    ref = warm.run(q, k, v)
    torch.testing.assert_close(out, ref, rtol=0, atol=0)  # deterministic: same plan, same bits


@pytest.mark.parametrize("family", ["default", "sm90ws", "sync-free"])
def test_plan_reused_on_one_stream_and_in_a_cuda_graph(family):
    """One device-built plan run again and again on one stream (the persistent kernel leaves its
    task counter zero for the next launch: a counter left at the end of the queue would leave
    the outputs poisoned), then captured in a CUDA graph after a warm-up run on the capture
    stream and replayed on new inputs into the same caller-owned outputs. "sync-free": a
    never-split plan whose task count the kernel reads from the device."""
    torch = _torch()
    regime = {"default": None,
              "sm90ws": lambda: _regime("sm90ws", split_ratio=2.0, min_split_chunks=2),
              "sync-free": lambda: _regime("sm90ws", split_ratio=1e9,
                                           combine_threshold=0.0)}[family]
    regime = regime and regime()
    rng = np.random.default_rng(16)
    host = rng.random((2, 10, 10)) < 0.4
    host[1, 3] = True  # a heavy row: split parts and a combine step for sm90ws
    mask = tessera.BlockMask.from_dense(torch.from_numpy(host).cuda(), block_size=128,
                                        seq_len_q=1200, seq_len_kv=1200)
    host_mask = tessera.BlockMask.from_dense(host, block_size=128, seq_len_q=1200,
                                             seq_len_kv=1200)
    q, k, v = (torch.randn(1, 2, 1200, 64, device="cuda", dtype=torch.bfloat16)
               for _ in range(3))
    out = torch.empty_like(q)
    lse = torch.empty(1, 2, 1200, device="cuda", dtype=torch.float32)
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        p = tessera.plan(mask, num_q_heads=2, head_dim=64, regime=regime)
    if family != "default":  # the default regime may come from the regime table
        assert p.sync_free == (family == "sync-free")

    def check():
        ref = reference.attention(*(x.float().cpu().numpy() for x in (q, k, v)), host_mask)
        got = out.float().cpu().numpy()
        assert not np.isnan(got).any()
        assert np.linalg.norm(got - ref) / np.linalg.norm(ref) < 1e-2
        counters = list(p.launch_state.task_counters.values())
        assert (family == "default" or counters) and all(int(c.get()[0]) == 0 for c in counters)

    for _ in range(3):
        with torch.cuda.stream(s):
            out.fill_(float("nan"))
            p.run(q, k, v, out=out, lse=lse)
        torch.cuda.synchronize()
        check()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=s):
        p.run(q, k, v, out=out, lse=lse)
    for _ in range(2):
        with torch.cuda.stream(s):
            q.copy_(torch.randn_like(q))
            out.fill_(float("nan"))
            g.replay()
        torch.cuda.synchronize()
        check()


def _fill_free_memory(cp) -> list:
    """Arrays of 7s over all the free memory of CuPy's pool that the current stream can take
    (chunks largest first). A request no free chunk serves is a new allocation: kept while
    filling (freed, the loop would take it again), then given back to the device, which leaves
    room for the checks' temporaries and for the next tests."""
    pool = cp.get_default_memory_pool()
    fills, fresh, size = [], [], pool.free_bytes() // 512 * 512
    while pool.free_bytes() and size >= 512 and len(fills) < 4096:
        before = pool.free_bytes()
        try:
            f = cp.full(size // 4, 7, dtype=cp.int32)
        except cp.cuda.memory.OutOfMemoryError:  # no free chunk that large, no device memory
            size //= 2
            continue
        if pool.free_bytes() >= before:  # not from a free chunk (another stream's, or none)
            fresh.append(f)
            size //= 2
        else:
            fills.append(f)
            size = min(size, pool.free_bytes() // 512 * 512)
    del fresh
    pool.free_all_blocks()  # the new allocations' (the fills hold the rest)
    return fills


def _still_filled(fills) -> bool:
    """Whether every array of :func:`_fill_free_memory` still holds only 7s (reductions, no
    temporaries the size of the fills)."""
    return all(int(f.min()) == 7 == int(f.max()) for f in fills)


def _capture_masks(rng, heads, n):
    """Masks of very different densities for the replays of one captured request, each with an
    empty row and a full one."""
    for density in (0.08, 0.6, 0.25):
        m = rng.random((heads, n, n)) < density
        m[:, 1], m[:, 2] = False, True
        yield m


@pytest.mark.parametrize("framework", ["torch", "cupy"])
def test_request_captured_in_a_cuda_graph(framework):
    """A whole request -- the mask object built from a device tensor, planned on the GPU and run
    -- captured into a CUDA graph after one warm-up request, then replayed with new masks and
    inputs written into the captured tensors: each replay plans its own mask (no host
    synchronization: the plan is sync-free) and matches the float64 reference, its output
    poisoned first. Memory made for the graph is the graph's: arrays allocated and filled
    between replays, and eager requests on another stream, neither corrupt the graph nor are
    corrupted by it (torch: the graph's private pool; CuPy: memory kept for the graph). A host
    mask, or a request whose constant arrays were never copied to the GPU (no warm-up), is
    refused by name inside the capture."""
    import cupy as cp

    rng = np.random.default_rng(30)
    H, L, n, D = 3, 1400, 11, 64
    host0 = next(_capture_masks(rng, H, n))
    if framework == "torch":
        torch = _torch()
        dt = torch.bfloat16
        q, k, v = (torch.randn(1, H, L, D, device="cuda", dtype=dt) for _ in range(3))
        mask_t = torch.from_numpy(host0).cuda()
        stream = torch.cuda.Stream()
        on_stream = lambda: torch.cuda.stream(stream)  # noqa: E731
        put = lambda dst, src: dst.copy_(torch.from_numpy(src).to(dst.dtype))  # noqa: E731
        exact = lambda t: t.float().cpu().numpy().astype(np.float64)  # noqa: E731
    else:
        q, k, v = (cp.asarray(rng.standard_normal((1, H, L, D)).astype(np.float16))
                   for _ in range(3))
        mask_t = cp.asarray(host0)
        stream = cp.cuda.Stream(non_blocking=True)
        on_stream = lambda: stream  # noqa: E731
        put = lambda dst, src: dst.set(src.astype(dst.dtype))  # noqa: E731
        exact = lambda t: t.get().astype(np.float64)  # noqa: E731
    tol = TOL["bfloat16" if framework == "torch" else "float16"]

    def request(seq_len=L):
        m = tessera.BlockMask.from_dense(mask_t, block_size=128, seq_len_q=seq_len,
                                         seq_len_kv=seq_len)
        return tessera.attention(*(t[:, :, :seq_len] for t in (q, k, v)), m)

    with on_stream():
        request()  # the warm-up: kernels loaded, the geometry's constants on the GPU
    cp.cuda.Device().synchronize()
    if framework == "torch":
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            out = request()
            host_mask = tessera.BlockMask.from_dense(host0, block_size=128, seq_len_q=L,
                                                     seq_len_kv=L)
            with pytest.raises(ValueError, match="block_mask must be on the GPU"):
                tessera.attention(q, k, v, host_mask)
        replay = graph.replay
    else:
        with stream:
            stream.begin_capture()
            try:
                out = request()
            finally:
                graph = stream.end_capture()
        replay = lambda: graph.launch(stream)  # noqa: E731
    eager_mask = tessera.BlockMask.from_dense(cp.asarray(rng.random((H, n, n)) < 0.3),
                                              block_size=128, seq_len_q=L, seq_len_kv=L)
    for host in _capture_masks(rng, H, n):
        cp.cuda.Device().synchronize()
        put(mask_t, host)
        for t in (q, k, v):
            put(t, rng.standard_normal(tuple(t.shape)).astype(np.float32))
        # Every free byte of CuPy's pool (whose free chunks belong to the stream they were
        # freed on) taken and filled now: memory the graph still writes would show here.
        fills = _fill_free_memory(cp)
        if framework == "cupy":
            with stream:
                fills += _fill_free_memory(cp)
        cp.cuda.Device().synchronize()
        with on_stream():
            replay()
        eager = tessera.attention(q, k, v, eager_mask)  # CuPy's current stream: another one
        cp.cuda.Device().synchronize()
        assert _still_filled(fills), "the graph wrote memory it gave back"
        host_mask = tessera.BlockMask.from_dense(host, block_size=128, seq_len_q=L,
                                                 seq_len_kv=L)
        ref = reference.attention(exact(q), exact(k), exact(v), host_mask)
        got = exact(out)
        assert not np.isnan(got).any(), "the replay left output unwritten"
        assert np.linalg.norm(got - ref) / np.linalg.norm(ref) < tol
        assert not np.isnan(exact(eager)).any()
    if framework == "torch":  # another geometry, never run outside a capture: refused by name
        with pytest.raises(RuntimeError, match="warm-up"):
            with torch.cuda.graph(torch.cuda.CUDAGraph(), stream=stream):
                request(seq_len=L - 64)
    else:
        assert tessera.release_captured_memory() > 0

def test_csr_device_mask_captured_in_a_cuda_graph():
    """A device mask held as CSR only (from scipy, moved to the GPU: no dense block matrix)
    planned and run inside a CUDA-graph capture: its dense rows are scattered on the GPU with
    nothing read back, and the replay matches the float64 reference (output poisoned)."""
    import cupy as cp
    import scipy.sparse as sp

    rng = np.random.default_rng(32)
    H, L, n, D = 2, 1200, 10, 64
    host = rng.random((H, n, n)) < 0.3
    host[:, 3] = False
    host[:, 5] = True
    geo = dict(block_size=128, seq_len_q=L, seq_len_kv=L)
    mask = tessera.BlockMask.from_scipy([sp.csr_array(h) for h in host], **geo).to_device()
    assert mask.on_device and mask.dense_rows is None
    (q, k, v), exact = _inputs(rng, "cupy", "float16", 1, H, H, L, L, D, "bhld")
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        tessera.attention(q, k, v, mask)  # the warm-up
        stream.begin_capture()
        try:
            out = tessera.attention(q, k, v, mask)
        finally:
            graph = stream.end_capture()
        graph.launch(stream)
    stream.synchronize()
    ref = reference.attention(*exact, tessera.BlockMask.from_dense(host, **geo))
    got = out.get().astype(np.float64)
    assert not np.isnan(got).any(), "the replay left output unwritten"
    assert np.linalg.norm(got - ref) / np.linalg.norm(ref) < TOL["float16"]

def test_replan_and_run_captured_in_a_cuda_graph():
    """A plan kept by the caller (one per layer), its replan and run captured into a CUDA graph
    on another stream than the one it ran on before -- the run's task counter for that stream
    and its output then come from the graph's memory -- and replayed for new masks written into
    the captured tensor, each against the float64 reference with the output poisoned; a host
    plan that never ran on the GPU is refused inside the capture before anything is launched.
    (Plan.replan works on CuPy's current stream: a torch caller makes it the captured one.)"""
    torch = _torch()
    from tessera.streams import cupy_external_stream

    rng = np.random.default_rng(31)
    H, L, n, D = 2, 1300, 11, 128
    masks = list(_capture_masks(rng, H, n))
    blocks = torch.from_numpy(masks[0]).cuda()
    q, k, v = (torch.randn(1, H, L, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    geo = dict(block_size=128, seq_len_q=L, seq_len_kv=L)
    p = tessera.plan(tessera.BlockMask.from_dense(blocks, **geo), num_q_heads=H, head_dim=D,
                     mode=PlanMode.CAPTURE)
    assert p.sync_free and p.replannable
    warm, s = torch.cuda.Stream(), torch.cuda.Stream()
    with torch.cuda.stream(warm):
        p.run(q, k, v)
    torch.cuda.synchronize()
    host_plan = tessera.plan(tessera.BlockMask.from_dense(masks[0], **geo), num_q_heads=H,
                             head_dim=D)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=s), cupy_external_stream(s.cuda_stream, 0):
        p.replan(tessera.BlockMask.from_dense(blocks, **geo))
        out = p.run(q, k, v)
        with pytest.raises(RuntimeError, match="run it once before capturing"):
            host_plan.run(q, k, v)
    for host in masks[1:] + masks[:1]:
        torch.cuda.synchronize()
        blocks.copy_(torch.from_numpy(host))
        for t in (q, k, v):
            t.copy_(torch.randn_like(t))
        torch.cuda.synchronize()
        with torch.cuda.stream(s):
            graph.replay()
        torch.cuda.synchronize()
        ref = reference.attention(*(t.float().cpu().numpy().astype(np.float64)
                                    for t in (q, k, v)),
                                  tessera.BlockMask.from_dense(host, **geo))
        got = out.float().cpu().numpy()
        assert not np.isnan(got).any(), "the replay left output unwritten"
        assert np.linalg.norm(got - ref) / np.linalg.norm(ref) < TOL["bfloat16"]

def test_tensors_on_a_second_gpu():
    """q/k/v and the mask on cuda:1 while cuda:0 is current: planning (device planner, kept plans
    and their CUDA-graph replans), the kernels and the outputs all on cuda:1; a host plan runs
    on both GPUs (the kernels are loaded once per device, whatever ran first); a mask or plan on
    the other GPU than q is refused by name."""
    torch = _torch()
    import cupy as cp

    if cp.cuda.runtime.getDeviceCount() < 2:
        pytest.skip("needs two GPUs")
    assert torch.cuda.current_device() == 0 and cp.cuda.Device().id == 0
    rng = np.random.default_rng(21)
    L = 1200
    host = rng.random((2, 10, 10)) < 0.3
    host_mask = tessera.BlockMask.from_dense(host, block_size=128, seq_len_q=L, seq_len_kv=L)
    on0 = [torch.randn(1, 2, L, 64, device="cuda:0", dtype=torch.bfloat16) for _ in range(3)]
    on1 = [x.to("cuda:1") for x in on0]
    ref = reference.attention(*(x.float().cpu().numpy().astype(np.float64) for x in on0),
                              host_mask)

    def check(out, device):
        assert out.device == torch.device(device)
        got = out.float().cpu().numpy()
        assert not np.isnan(got).any()
        assert np.linalg.norm(got - ref) / np.linalg.norm(ref) < TOL["bfloat16"]

    hp = tessera.plan(host_mask, num_q_heads=2, head_dim=64)
    check(hp.run(*on0), "cuda:0")  # kernels loaded on device 0 first
    check(hp.run(*on1), "cuda:1")
    never_splits = Regime(combine_threshold=0.0, split_ratio=1e9)
    for regime in (None, never_splits, never_splits):  # new plan, kept plan, CUDA-graph replan
        mask = tessera.BlockMask.from_dense(torch.from_numpy(host).to("cuda:1"), block_size=128,
                                            seq_len_q=L, seq_len_kv=L)
        assert mask.device_id == 1
        check(tessera.attention(*on1, mask, regime=regime), "cuda:1")
    p = tessera.plan(mask, num_q_heads=2, head_dim=64, regime=never_splits)
    assert p.launch_queue.tasks.device.id == 1 and cp.cuda.Device().id == 0
    check(p.run(*on1), "cuda:1")
    torch.cuda.synchronize(1)
    with pytest.raises(ValueError, match="device"):
        tessera.attention(*on0, mask)
    with pytest.raises(ValueError, match="device"):
        p.run(*on0)
    with pytest.raises(ValueError, match="device"):
        p.replan(tessera.BlockMask.from_dense(cp.asarray(host), block_size=128, seq_len_q=L,
                                              seq_len_kv=L))


def test_bf16_cupy_arrays_give_a_bf16_cupy_output():
    """bf16 CuPy q/k/v (CuPy 14 with ml_dtypes) come back as a bf16 CuPy output and a float32
    LSE, equal to the reference on the bf16 values (they came back as uint16 bits before)."""
    import cupy as cp

    from tessera.interop import cupy_bfloat16

    bf16 = cupy_bfloat16()
    if bf16 is None:
        pytest.skip("this CuPy holds no bfloat16 (CuPy 14 with ml_dtypes does)")
    rng = np.random.default_rng(11)
    mask = _random_mask(rng, (2, 4, 5), 0.5, block_size=64, seq_len_q=250, seq_len_kv=300)

    def bf16_pair(shape):  # a bf16 device array and the exact values it holds
        bits = (rng.standard_normal(shape).astype(np.float32).view(np.uint32) >> 16)
        exact = (bits << 16).view(np.float32).astype(np.float64)
        return cp.asarray(bits.astype(np.uint16)).view(bf16), exact

    (q, qe), (k, ke), (v, ve) = (bf16_pair((1, 2, n, 64)) for n in (250, 300, 300))
    out, lse = tessera.attention(q, k, v, mask, return_lse=True)
    assert isinstance(out, cp.ndarray) and out.dtype == bf16 and lse.dtype == cp.float32
    got = (out.view(cp.uint16).get().astype(np.uint32) << 16).view(np.float32)
    ref = reference.attention(qe, ke, ve, mask)
    worst = (np.linalg.norm(got - ref, axis=-1) /
             np.maximum(np.linalg.norm(ref, axis=-1), 1e-30)).max()
    assert np.isfinite(got).all() and worst < 2e-2, f"worst row {worst:.2e}"


def _splitting_plan(seed: int, dtype: str):
    """A 2-head mask with heavy rows and a plan of it whose tasks split (partials and a
    combine step): what per-stream workspaces protect."""
    rng = np.random.default_rng(seed)
    dense = rng.random((2, 10, 12)) < 0.3
    dense[:, 3] = True  # heavy rows: split
    mask = tessera.BlockMask.from_dense(dense, block_size=64)
    reg = Regime(block_m=64, num_warps=4, split_ratio=1.0, min_split_chunks=1)
    p = tessera.plan(mask, num_q_heads=2, head_dim=64, dtype=dtype, regime=reg)
    assert p.queue.combine.shape[0] > 0
    return mask, p


def test_one_splitting_plan_on_two_streams_at_once():
    """A plan whose tasks split run on two streams at once, each behind a random delay (so that
    some rounds overlap the runs), on different inputs: each stream has its own partials, so
    both outputs stay exact over every round (one workspace per plan and device let the runs
    overwrite each other's partials)."""
    torch = _torch()
    mask, p = _splitting_plan(5, "bfloat16")
    streams = [torch.cuda.Stream(), torch.cuda.Stream()]
    inputs = []
    for seed in (1, 2):
        (q, k, v), exact = _inputs(np.random.default_rng(seed), "torch", "bfloat16", 1, 2, 2,
                                   640, 768, 64, "bhld")
        inputs.append(((q, k, v), reference.attention(*exact, mask)))
    torch.cuda.synchronize()
    delays = np.random.default_rng(0).integers(0, 40_000, size=(50, 2))
    for round_delays in delays:  # some rounds overlap the two runs, some do not
        outs = []
        for s, ((q, k, v), _), cycles in zip(streams, inputs, round_delays):
            with torch.cuda.stream(s):
                torch.cuda._sleep(int(cycles))
                outs.append(p.run(q, k, v))
        torch.cuda.synchronize()
        for out, (_, ref) in zip(outs, inputs):
            got = out.float().cpu().numpy()
            err = np.linalg.norm(got - ref) / np.linalg.norm(ref)
            assert err < 1e-2, f"relative error {err:.2e}"
    assert len(p.launch_state.workspaces) == 2


_SPIN = r"""
extern "C" __global__ void spin(long long cycles) {
  const long long t0 = clock64();
  while (clock64() - t0 < cycles) {}
}
"""


def test_a_stream_at_a_destroyed_streams_address_gets_its_own_state():
    """CuPy destroys a stream with its object, and the next stream made often gets its address
    while the old one's work is still pending. Per-stream state (split-KV partials, the task
    counter) follows the driver's stream id: the new stream's run, overlapping the old one's,
    gets its own, and both outputs stay exact (keyed by address they shared one)."""
    import gc

    import cupy as cp

    mask, p = _splitting_plan(6, "float16")
    spin = cp.RawKernel(_SPIN, "spin")
    cycles = np.int64(50_000_000)  # ~25 ms at the H200's clock
    inputs = []
    for seed in (3, 4):
        (q, k, v), exact = _inputs(np.random.default_rng(seed), "cupy", "float16", 1, 2, 2,
                                   640, 768, 64, "bhld")
        inputs.append(((q, k, v), reference.attention(*exact, mask)))
    for _ in range(20):
        old = cp.cuda.Stream(non_blocking=True)
        with old:
            spin((1,), (1,), (cycles,))
            out_old = p.run(*inputs[0][0])
        address = old.ptr
        del old
        gc.collect()
        new = cp.cuda.Stream(non_blocking=True)
        if new.ptr == address:
            break
        cp.cuda.Device().synchronize()
    else:
        pytest.skip("the driver gave no new stream a destroyed stream's address")
    with new:
        spin((1,), (1,), (cycles,))
        out_new = p.run(*inputs[1][0])
    cp.cuda.Device().synchronize()
    at_address = [key for key in p.launch_state.workspaces if key[1] == address]
    assert len(at_address) >= 2, "the new stream reused the old one's partials"
    for out, (_, ref) in zip((out_old, out_new), inputs):
        got = cp.asnumpy(out).astype(np.float64)
        err = np.linalg.norm(got - ref) / np.linalg.norm(ref)
        assert err < 5e-3, f"relative error {err:.2e}"


def test_one_cupy_graphs_memory_given_back_while_another_replays():
    """Two requests captured into two CuPy graphs, each inside its own tessera.CapturedMemory:
    releasing the first gives back its bytes (the pool's free memory grows by them) and leaves
    the second's, whose replays -- after the freed memory is taken and filled -- still match
    the float64 reference with new masks and inputs written into the captured arrays."""
    import cupy as cp

    rng = np.random.default_rng(31)
    H, D = 2, 64
    tessera.release_captured_memory()
    graphs = []
    for L, n in ((1100, 9), (1400, 11)):
        q, k, v = (cp.asarray(rng.standard_normal((1, H, L, D)).astype(np.float16))
                   for _ in range(3))
        mask_t = cp.asarray(rng.random((H, n, n)) < 0.4)
        stream = cp.cuda.Stream(non_blocking=True)

        def request(q=q, k=k, v=v, mask_t=mask_t, L=L):
            m = tessera.BlockMask.from_dense(mask_t, block_size=128, seq_len_q=L, seq_len_kv=L)
            return tessera.attention(q, k, v, m)

        with stream:
            request()  # the warm-up
        stream.synchronize()
        kept = tessera.CapturedMemory()
        with kept, stream:
            stream.begin_capture()
            try:
                out = request()
            finally:
                graph = stream.end_capture()
        assert kept.nbytes > 0, "the capture kept no memory for its graph"
        graphs.append((kept, graph, stream, out, (q, k, v, mask_t), L))
    pool = cp.get_default_memory_pool()
    first = graphs[0][0]
    del graphs[0], request, out, graph  # the first graph and its output: nothing else holds it
    (second, graph, stream, out, (q, k, v, mask_t), L), = graphs
    kept_second = second.nbytes
    free_before = pool.free_bytes()
    released = first.release()
    assert released > 0 and first.nbytes == 0 and second.nbytes == kept_second
    assert pool.free_bytes() >= free_before + released
    fills = _fill_free_memory(cp)
    for _ in range(2):
        with stream:  # the replays' stream orders these writes before them
            mask_t[...] = cp.asarray(rng.random(mask_t.shape) < 0.4)
            for t in (q, k, v):
                t[...] = cp.asarray(rng.standard_normal(t.shape).astype(np.float16))
            out.fill(cp.nan)
        graph.launch(stream)
        stream.synchronize()
        host = tessera.BlockMask.from_dense(mask_t.get(), block_size=128, seq_len_q=L,
                                            seq_len_kv=L)
        ref = reference.attention(*(t.get().astype(np.float64) for t in (q, k, v)), host)
        got = out.get().astype(np.float64)
        assert not np.isnan(got).any()
        assert_rows_close(got, ref, "float16")
    assert _still_filled(fills)
    del fills
    assert second.release() == kept_second
    assert tessera.release_captured_memory() == 0


def test_captured_request_survives_the_constant_cache_emptying():
    """A captured request reads its geometry's constant arrays by address; after 140 other
    geometries empty the cache of such arrays, garbage is collected and CuPy's pool is taken
    and filled, the replay still matches the reference (it read freed memory before)."""
    import gc

    import cupy as cp

    torch = _torch()
    rng = np.random.default_rng(12)
    H, n, D = 2, 6, 64
    L = n * 128
    q, k, v = (torch.randn(1, H, L, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    mask_t = torch.from_numpy(rng.random((H, n, n)) < 0.4).cuda()
    stream = torch.cuda.Stream()

    def request():
        m = tessera.BlockMask.from_dense(mask_t, block_size=128, seq_len_q=L, seq_len_kv=L)
        return tessera.attention(q, k, v, m)

    with torch.cuda.stream(stream):
        request()  # the warm-up
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        out = request()
    cp.get_default_memory_pool().free_all_blocks()  # the fills below: what is freed from here
    for i in range(140):  # other geometries of device masks: their constants fill the cache
        other = tessera.BlockMask.from_dense(cp.ones((1, i + 1, 2), dtype=bool), block_size=64)
        tessera.plan(other, num_q_heads=1, head_dim=64)
    gc.collect()
    fills = _fill_free_memory(cp)
    mask_t.copy_(torch.from_numpy(rng.random((H, n, n)) < 0.4))
    with torch.cuda.stream(stream):
        graph.replay()
    torch.cuda.synchronize()
    host = tessera.BlockMask.from_dense(mask_t.cpu().numpy(), block_size=128)
    ref = reference.attention(*(t.float().cpu().numpy().astype(np.float64) for t in (q, k, v)),
                              host)
    got = out.float().cpu().numpy()
    assert _still_filled(fills)
    del fills
    assert not np.isnan(got).any() and np.linalg.norm(got - ref) / np.linalg.norm(ref) < 1e-2
