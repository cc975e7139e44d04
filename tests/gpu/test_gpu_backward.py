"""GPU: tessera.attention_backward and Plan.run_backward against the float64 reference's
gradients on fresh random inputs, outputs poisoned first (every element must be written): ragged
and variable blocks, empty rows and unselected keys, GQA with a mask per kv or query head, both
layouts, bf16 and fp16, head dims 64, 96 and 128, the device's kernels and (on sm_90) the
portable ones too; bitwise repeatable (dQ but where it is summed by atomics); torch autograd
through tessera.attention. Marked ``gpu``: skipped where there is no GPU."""

from __future__ import annotations

import numpy as np
import pytest

import tessera
from tessera import BlockMask, reference
from tests.gpu.test_attention import TOL, _inputs, _poison, _to_numpy  # noqa: F401

pytestmark = pytest.mark.gpu

# A gradient row sums P (dP - Delta) terms that cancel, so rounded inputs move it more than
# an output row; its error is measured against the tensor's typical row (RMS row norm) where
# the row itself is smaller than a tenth of that.
TOL_ROW = {"bfloat16": 4e-2, "float16": 2e-2}


def _ragged_mask(rng, mask_heads, b=1):
    qb = np.array([0, 70, 128, 150, 256, 300, 431, 512])
    kb = np.array([0, 64, 100, 228, 237, 300, 400, 512])
    dense = rng.random((b, mask_heads, 7, 7)) < 0.45
    dense[:, 0, 2] = False  # a query block that selects nothing
    dense[..., 0, 0] = True
    dense[:, -1, :, 3] = False  # a key block no query of the last mask head selects
    return BlockMask.from_dense(dense, q_bounds=qb, kv_bounds=kb)


def check_gradients(got, ref, dtype, name, rows_ref=None):
    """The whole tensor against ``ref`` (float64 from the exact inputs), every row against
    ``rows_ref`` (default ``ref``): where the softmax is sharp, a dQ row's terms cancel and
    Delta = rowsum(dO * O) read from the forward's rounded output moves it further than bf16
    rounding of the row itself (the float64 emulation with that output rounded shows the same),
    so the fuzz checks its rows against float64 from the kernel's own out and LSE."""
    g, r = _to_numpy(got), ref
    assert g.shape == r.shape, name
    assert not np.isnan(g).any(), f"{name} has NaN (unwritten or broken)"
    err = np.linalg.norm(g - r) / max(np.linalg.norm(r), 1e-30)
    assert err <= TOL[dtype], f"{name}: relative error {err:.2e}"
    r = r if rows_ref is None else rows_ref
    g2, r2 = g.reshape(-1, g.shape[-1]), r.reshape(-1, r.shape[-1])
    norm = np.linalg.norm(r2, axis=1)
    empty = norm == 0
    assert not np.abs(g2[empty]).any(), f"{name}: a row with no selected pair is not zero"
    floor = 0.1 * np.sqrt(np.mean(norm ** 2))
    rows = np.linalg.norm(g2 - r2, axis=1)[~empty] / np.maximum(norm[~empty], floor)
    worst = rows.max(initial=0.0)
    assert worst <= TOL_ROW[dtype], f"{name}: worst row's relative error {worst:.2e}"
    return err, worst


def _backward_case(mask, *, dtype="bfloat16", b=1, hq=4, hkv=2, d=64, layout="bhld", seed=0,
                   scale=None):
    rng = np.random.default_rng(seed)
    (q, k, v), (qe, ke, ve) = _inputs(rng, "cupy", dtype, b, hq, hkv, mask.seq_len_q,
                                      mask.seq_len_kv, d, layout)
    (dout, _, _), (de, _, _) = _inputs(rng, "cupy", dtype, b, hq, hkv, mask.seq_len_q, 16, d,
                                       layout)
    out, lse = tessera.attention(q, k, v, mask, return_lse=True, layout=layout, scale=scale)
    grads = tessera.attention_backward(q, k, v, out, lse, dout, mask, scale=scale, layout=layout)
    want = reference.attention_backward(qe, ke, ve, de, mask, scale=scale, layout=layout)
    for got, ref, name in zip(grads, want, ("dq", "dk", "dv")):
        check_gradients(got, ref, dtype, name)
    return (q, k, v, out, lse, dout), grads


CASES = [(d, dtype, heads, layout) for d in (64, 96, 128) for dtype in ("bfloat16", "float16")
         for heads, layout in ((1, "bhld"), (2, "blhd"), (4, "bhld"))]


@pytest.fixture(params=["device", "atomic", "cp.async", "atomic-cp.async", "portable"])
def family(request):
    """The device's backward kernels (two passes), and where they differ (sm_90) the Hopper
    dK/dV kernel summing dQ by atomics, each with its chunks copied by TMA (where the operands
    allow: every case here) and by cp.async, and the portable kernels."""
    if request.param != "device":
        from tessera.cuda.loader import device_cc

        if device_cc() != 90:
            pytest.skip("the device's kernels are the portable ones")
    with tessera.config.override(portable_backward=request.param == "portable",
                                 deterministic_backward="atomic" not in request.param,
                                 use_tma="cp.async" not in request.param):
        yield request.param


def _bitwise(family: str) -> bool:
    """Whether ``family``'s gradients repeat bit for bit (no floating-point atomics)."""
    return "atomic" not in family


def assert_same_gradients(got, want, bitwise: bool) -> None:
    """Bit for bit, or (dQ summed by atomics in another order) within float32 summation's
    rounding once rounded to the element type: a few units in the last place."""
    for a, b_ in zip(got, want):
        x, y = _to_numpy(a), _to_numpy(b_)  # (exact: float64 holds every bf16 and fp16)
        assert not np.isnan(x).any()
        if bitwise:
            assert (x == y).all()
        else:
            assert np.abs(x - y).max() <= 2e-2 * max(np.abs(y).max(), 1e-30)


@pytest.mark.parametrize("d,dtype,mask_heads,layout", CASES,
                         ids=[f"d{d}-{t}-mh{h}-{lay}" for d, t, h, lay in CASES])
def test_backward_equals_the_float64_reference(d, dtype, mask_heads, layout, family):
    """Ragged blocks, an empty query block, a key block nobody selects, GQA 4:2 with one mask,
    one per kv head or one per query head."""
    rng = np.random.default_rng(d + mask_heads)
    _backward_case(_ragged_mask(rng, mask_heads), dtype=dtype, d=d, layout=layout,
                   seed=mask_heads, scale=0.09 if mask_heads == 2 else None)


@pytest.mark.parametrize("d", [64, 128])
def test_rows_and_keys_no_pair_selects_may_hold_inf(d, family):
    """Inf in the q and dO rows of a query block nothing selects and (but with dQ by atomics)
    in the K and V rows of a key block nobody selects: those rows' dQ and dK/dV are zero and
    every other gradient equals the reference's. (A TMA chunk copies the rows that follow a
    span: the kernels zero those that a product multiplies by zero weights, as 0 x Inf is NaN.
    dQ by atomics multiplies the whole key tile's K, unselected rows too: docs/errors.md.)"""
    rng = np.random.default_rng(d)
    qb = np.array([0, 70, 128, 150, 256, 300, 431, 512])
    kb = np.array([0, 64, 100, 228, 237, 300, 400, 512])
    dense = rng.random((1, 2, 7, 7)) < 0.5
    dense[..., 0, :2] = True
    dense[..., 2, :] = False  # query rows 128-149: nothing selected
    dense[..., :, 2] = False  # keys 100-227: nobody selects them
    mask = BlockMask.from_dense(dense, q_bounds=qb, kv_bounds=kb)
    (q, k, v), (qe, ke, ve) = _inputs(rng, "cupy", "bfloat16", 1, 4, 2, 512, 512, d, "bhld")
    (dout, _, _), (de, _, _) = _inputs(rng, "cupy", "bfloat16", 1, 4, 2, 512, 16, d, "bhld")
    want = reference.attention_backward(qe, ke, ve, de, mask)
    for x in (q, dout):
        x[:, :, 128:150] = float("inf")
    for x in (k, v) if "atomic" not in family else ():
        x[:, :, 100:228] = float("inf")
    out, lse = tessera.attention(q, k, v, mask, return_lse=True)
    grads = tessera.attention_backward(q, k, v, out, lse, dout, mask)
    for got, ref, name in zip(grads, want, ("dq", "dk", "dv")):
        check_gradients(got, ref, "bfloat16", name)


@pytest.mark.parametrize("d", [64, 96, 128])
def test_uniform_and_variable_blocks_batched(d, family):
    """128- and 64-token blocks at 30% and random variable blocks (32-256 tokens, and 24-64:
    the Hopper kernels' 64-row tasks, partial chunks), batch 2, MHA and GQA 3:1."""
    from tessera.runtime.regime.backward import default_backward_regime
    from tessera.runtime.regime.heuristic import typical_q_block

    def sm90_tile_rows(m):  # the heuristic's rows (the tests run without a table's backward)
        return default_backward_regime(90, typical_q_block(m.q_bounds),
                                       typical_q_block(m.kv_bounds)).block_m

    rng = np.random.default_rng(d)
    uniform = BlockMask.from_dense(rng.random((2, 2, 8, 8)) < 0.3, block_size=128)
    _backward_case(uniform, b=2, hq=2, hkv=2, d=d, seed=1)
    small = BlockMask.from_dense(rng.random((2, 2, 12, 12)) < 0.3, block_size=64)
    assert sm90_tile_rows(small) == 64
    _backward_case(small, b=2, hq=2, hkv=2, d=d, seed=3)

    def bounds(lo, hi, n):
        return np.concatenate([[0], np.cumsum(rng.integers(lo, hi + 1, n))])

    variable = BlockMask.from_dense(rng.random((2, 1, 9, 9)) < 0.3, q_bounds=bounds(32, 256, 9),
                                    kv_bounds=bounds(32, 256, 9))
    _backward_case(variable, b=2, hq=3, hkv=1, d=d, seed=2)
    short = BlockMask.from_dense(rng.random((2, 1, 14, 14)) < 0.4, q_bounds=bounds(24, 64, 14),
                                 kv_bounds=bounds(24, 64, 14))
    assert sm90_tile_rows(short) == 64
    _backward_case(short, b=2, hq=3, hkv=1, d=d, seed=4)


@pytest.mark.parametrize("d", [64, 128])
def test_backward_is_bitwise_repeatable_and_a_plan_runs_the_same(family, d):
    """Without atomics two runs give the same bits and Plan.run_backward equals
    attention_backward; with dQ by atomics they agree to its rounding, dK and dV bit for bit."""
    rng = np.random.default_rng(7)
    mask = _ragged_mask(rng, 2)
    (q, k, v, out, lse, dout), first = _backward_case(mask, d=d, seed=3)
    again = tessera.attention_backward(q, k, v, out, lse, dout, mask)
    p = tessera.plan(mask, num_q_heads=4, num_kv_heads=2, head_dim=d)
    planned = p.run_backward(q, k, v, out, lse, dout)
    for other in (again, planned):
        assert_same_gradients(first, other, _bitwise(family))
        assert_same_gradients(first[1:], other[1:], True)


@pytest.mark.parametrize("d", [64, 128])
def test_every_backward_regime_given_computes_the_references_gradients(d):
    """Each regime the profiler times (``candidate_backward_regimes``: on sm_90 128- and 64-row
    tasks, dQ by atomics or two passes, chunks by TMA or cp.async; the portable one) given to
    ``attention_backward`` and ``Plan.run_backward``: float64's gradients, poisoned outputs,
    GQA on a ragged mask; one that does not run on this GPU is refused by name."""
    from tessera.cuda.loader import device_cc
    from tessera.runtime.regime.backward import BackwardRegime, candidate_backward_regimes

    cc = device_cc()
    mask = _ragged_mask(np.random.default_rng(d), 2)
    rng = np.random.default_rng(d + 1)
    (q, k, v), (qe, ke, ve) = _inputs(rng, "cupy", "bfloat16", 1, 4, 2, 512, 512, d, "bhld")
    (dout, _, _), (de, _, _) = _inputs(rng, "cupy", "bfloat16", 1, 4, 2, 512, 16, d, "bhld")
    out, lse = tessera.attention(q, k, v, mask, return_lse=True)
    want = reference.attention_backward(qe, ke, ve, de, mask)
    p = tessera.plan(mask, num_q_heads=4, num_kv_heads=2, head_dim=d)
    regimes = candidate_backward_regimes(cc) + (candidate_backward_regimes(None) if cc == 90
                                                else [])
    for r in regimes:
        for how, grads in (("attention_backward", tessera.attention_backward(
                               q, k, v, out, lse, dout, mask, regime=r)),
                           ("run_backward", p.run_backward(q, k, v, out, lse, dout, regime=r))):
            for got, ref, name in zip(grads, want, ("dq", "dk", "dv")):
                check_gradients(got, ref, "bfloat16", f"{r.name} {how} {name}")
    if cc != 90:
        with pytest.raises(ValueError, match="runs on sm_90 only"):
            p.run_backward(q, k, v, out, lse, dout, regime=BackwardRegime())


@pytest.mark.parametrize("d,tma", [(64, True), (64, False), (128, True), (128, False)])
def test_two_partial_dq_sets_compute_the_references_gradients(d, tma, monkeypatch):
    """dQ by atomics with two sets of partial-dQ tiles (SM90_DQ_BUFFERS): float64's gradients
    on a ragged GQA mask whose tasks walk many chunks, poisoned outputs."""
    from tessera.cuda.loader import device_cc
    from tessera.runtime.regime import backward as bw

    if device_cc() != 90:
        pytest.skip("the Hopper backward runs on sm_90 only")
    monkeypatch.setattr(bw, "SM90_DQ_BUFFERS", {d: 2})
    monkeypatch.setattr(tessera.config, "poison_outputs", True)
    mask = _ragged_mask(np.random.default_rng(5), 2)
    rng = np.random.default_rng(6)
    (q, k, v), (qe, ke, ve) = _inputs(rng, "cupy", "bfloat16", 1, 4, 2, 512, 512, d, "bhld")
    (dout, _, _), (de, _, _) = _inputs(rng, "cupy", "bfloat16", 1, 4, 2, 512, 16, d, "bhld")
    out, lse = tessera.attention(q, k, v, mask, return_lse=True)
    want = reference.attention_backward(qe, ke, ve, de, mask)
    r = bw.BackwardRegime(tma=tma)
    assert r.dq == "atomics" and r.kernels(d, True, 90)[0].macro("DQ_BUFFERS") == 2
    grads = tessera.attention_backward(q, k, v, out, lse, dout, mask, regime=r)
    for got, ref, name in zip(grads, want, ("dq", "dk", "dv")):
        check_gradients(got, ref, "bfloat16", f"two sets {name}")


def test_bad_gradient_inputs_are_refused_by_name():
    import cupy as cp

    rng = np.random.default_rng(0)
    mask = _ragged_mask(rng, 1)
    (q, k, v, out, lse, dout), _ = _backward_case(mask, d=64, seed=0)
    with pytest.raises(ValueError, match=r"dout must have q's shape \(1, 4, 512, 64\)"):
        tessera.attention_backward(q, k, v, out, lse, dout[:, :2], mask)
    with pytest.raises(TypeError, match="out must be bfloat16 like q"):
        tessera.attention_backward(q, k, v, out.astype(cp.float32), lse, dout, mask)
    with pytest.raises(ValueError, match="lse must be the forward's contiguous float32 LSE"):
        tessera.attention_backward(q, k, v, out, lse[:, :, :100], dout, mask)
    with pytest.raises(ValueError, match="dout must be contiguous in the head dim"):
        tessera.attention_backward(q, k, v, out, lse, dout[..., ::-1], mask)


def _leaves(rng, hq, hkv, d, layout):
    """bf16 torch q, k, v on the GPU (512 tokens) that require grad, their exact float64
    values, and a random weight w of the output's shape (the loss is sum(out * w))."""
    import torch

    (q, k, v), exact = _inputs(rng, "torch", "bfloat16", 1, hq, hkv, 512, 512, d, layout)
    shape = (1, hq, 512, d) if layout == "bhld" else (1, 512, hq, d)
    w = torch.randn(*shape, device="cuda").to(torch.bfloat16)
    return tuple(x.detach().requires_grad_() for x in (q, k, v)), exact, w


def _check_leaf_gradients(leaves, exact, w, mask, layout) -> None:
    """The leaves' bf16 gradients of sum(out * w) against the float64 reference's."""
    import torch

    we = w.float().cpu().numpy().astype(np.float64)
    want = reference.attention_backward(*exact, we, mask, layout=layout)
    for x, ref, name in zip(leaves, want, ("dq", "dk", "dv")):
        assert x.grad is not None and x.grad.dtype == torch.bfloat16, name
        check_gradients(x.grad, ref, "bfloat16", name)


def test_torch_autograd_through_tessera_attention():
    """loss.backward() through tessera.attention on CUDA tensors (blhd, GQA) gives the float64
    reference's gradients of the same loss."""
    pytest.importorskip("torch")
    rng = np.random.default_rng(5)
    mask = _ragged_mask(rng, 2)
    (q, k, v), exact, w = _leaves(rng, 4, 2, 64, "blhd")
    out = tessera.attention(q, k, v, mask, layout="blhd")
    (out.float() * w.float()).sum().backward()
    _check_leaf_gradients((q, k, v), exact, w, mask, "blhd")


@pytest.mark.parametrize("hq,hkv", [(3, 3), (6, 3)], ids=["mha", "gqa"])
@pytest.mark.parametrize("geometry", ["ragged", "uniform64"])
def test_a_device_mask_is_planned_on_the_device(geometry, hq, hkv, family):
    """A device mask's backward queues come from the planner kernels (task counts left on the
    device; GQA's groups merged by array operations on the device): the gradients are the
    reference's and, the same tasks walking each row in the same order, those of the
    host-planned queues of the same mask (bitwise without atomics)."""
    import cupy as cp

    from tessera.runtime.backward import BackwardPlan
    from tessera.runtime.plan import checked_shape

    rng = np.random.default_rng(21)
    if geometry == "ragged":
        host = _ragged_mask(rng, 3, b=2)
    else:
        host = BlockMask.from_dense(rng.random((2, 1, 10, 9)) < 0.3, block_size=64,
                                    seq_len_q=600, seq_len_kv=560)
    dense = host.to_dense()
    device = BlockMask.from_dense(cp.asarray(dense), q_bounds=host.q_bounds,
                                  kv_bounds=host.kv_bounds)
    for d in (64, 128):
        (q, k, v, out, lse, dout), on_device = _backward_case(device, b=2, hq=hq, hkv=hkv, d=d,
                                                              seed=d)
        on_host = tessera.attention_backward(q, k, v, out, lse, dout, host)
        assert_same_gradients(on_device, on_host, _bitwise(family))
    shape = checked_shape(device, hq, hkv, 128, None, 2, "bfloat16", "bhld")
    assert BackwardPlan(device, shape).backward_queues(128).on_device


def test_a_backward_request_never_waits_for_the_gpu():
    """At a model's shape (Wan-1.3B: 12 heads x 256 query blocks of 128 tokens) with the GPU
    busy for a long while, the backward of a new device mask is planned and launched without
    the host waiting for the GPU (once a first device mask's request has loaded the planner's
    kernels: a process's first one waits for that), and gives the gradients of the host-planned
    queues (bit for bit, but dQ where the default mode sums it by atomics)."""
    from tessera.cuda.loader import device_cc

    torch = pytest.importorskip("torch")
    h, n = 12, 256
    L = n * 128
    blocks = torch.rand(h, n, n, device="cuda") < 0.1
    q, k, v, dout = (torch.randn(1, h, L, 128, device="cuda", dtype=torch.bfloat16)
                     for _ in range(4))
    mask = BlockMask.from_dense(blocks, block_size=128)
    out, lse = tessera.attention(q, k, v, mask, return_lse=True)
    host = BlockMask.from_dense(blocks.cpu().numpy(), block_size=128)
    want = tessera.attention_backward(q, k, v, out, lse, dout, host)  # compiles the kernels
    warm = BlockMask.from_dense(torch.rand(h, n, n, device="cuda") < 0.1, block_size=128)
    tessera.attention_backward(q, k, v, out, lse, dout, warm)  # loads the planner's kernels
    torch.cuda.synchronize()
    torch.cuda._sleep(2_000_000_000)  # ~1 s of GPU time on the current stream
    busy = torch.cuda.Event()
    busy.record()
    got = tessera.attention_backward(q, k, v, out, lse, dout,
                                     BlockMask.from_dense(blocks, block_size=128))
    assert not busy.query(), "the backward request waited for the GPU"
    torch.cuda.synchronize()
    atomic = tessera.plan(host, num_q_heads=h, head_dim=128).backward_regime(
        device_cc(), deterministic=tessera.config.deterministic_backward).dq == "atomics"
    assert_same_gradients(got, want, not atomic)
    assert_same_gradients(got[1:], want[1:], True)


def test_torch_autograd_through_a_plans_run():
    """Plan.run on tensors that require grad is differentiable: its backward is the plan's
    run_backward (the queues kept on the plan), the float64 reference's gradients."""
    pytest.importorskip("torch")
    rng = np.random.default_rng(6)
    mask = _ragged_mask(rng, 1)
    (q, k, v), exact, w = _leaves(rng, 2, 2, 128, "bhld")
    p = tessera.plan(mask, num_q_heads=2, head_dim=128)
    (p.run(q, k, v).float() * w.float()).sum().backward()
    assert p.launch_state.backward_queues  # planned once, kept for the next step
    _check_leaf_gradients((q, k, v), exact, w, mask, "bhld")
