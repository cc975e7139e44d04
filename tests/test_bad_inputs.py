"""Bad input to the public entry points, as a new user types it: each case is refused with a
ValueError or TypeError naming the argument, before anything runs (no GPU needed). The same
cases make the table in docs/errors.md."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

import tessera
from tessera import BlockMask, families, quantization
from tessera.launch import check_int8_regime
from tessera.quantize_launch import check_int8, quantize_operands, v_key_order
from tessera.integrations import distributed, methods, presets

M = BlockMask.from_dense(np.ones((2, 2), bool), block_size=64)
X = np.zeros((1, 1, 128, 64), np.float32)
LSE = np.zeros((1, 1, 128), np.float32)


def _plan(**kw):
    args = dict(num_q_heads=1, head_dim=64)
    args.update(kw)
    return tessera.plan(M, **args)


# (entry point, input, call, error type, message pattern)
CASES = [
    ("BlockMask.from_dense", "None", lambda: BlockMask.from_dense(None, block_size=64),
     TypeError, "mask must be a boolean block matrix"),
    ("BlockMask.from_dense", "a scipy matrix", lambda: BlockMask.from_dense(
        sp.csr_array(np.eye(2)), block_size=64), TypeError, "use BlockMask.from_scipy"),
    ("BlockMask.from_dense", "an int matrix", lambda: BlockMask.from_dense(
        np.ones((2, 2), int), block_size=64), TypeError, "mask must be boolean"),
    ("BlockMask.from_dense", "no blocks", lambda: BlockMask.from_dense(
        np.ones((0, 2), bool), block_size=64), ValueError, "at least one q block"),
    ("BlockMask.from_dense", "no heads", lambda: BlockMask.from_dense(
        np.ones((0, 2, 2), bool), block_size=64), ValueError, "at least one batch and one head"),
    ("BlockMask.from_dense", "block_size=(64,)", lambda: BlockMask.from_dense(
        np.ones((2, 2), bool), block_size=(64,)), ValueError, "block_size must be an int or"),
    ("BlockMask.from_dense", "block_size=0", lambda: BlockMask.from_dense(
        np.ones((2, 2), bool), block_size=0), ValueError, "block_size must be a positive int"),
    ("BlockMask.from_dense", "block_size=2**30", lambda: BlockMask.from_dense(
        np.ones((4, 4), bool), block_size=2**30), ValueError, "token offsets are int32"),
    ("BlockMask.from_dense", "seq_len_q past the blocks", lambda: BlockMask.from_dense(
        np.ones((2, 2), bool), block_size=64, seq_len_q=200), ValueError,
     "seq_len_q=200 does not fit 2 blocks"),
    ("BlockMask.from_dense", "bounds not from 0", lambda: BlockMask.from_dense(
        np.ones((1, 1), bool), q_bounds=[1, 64], kv_bounds=[0, 64]), ValueError,
     "q_bounds must start at 0"),
    ("BlockMask.from_dense", "block_size and bounds", lambda: BlockMask.from_dense(
        np.ones((1, 1), bool), block_size=64, q_bounds=[0, 64], kv_bounds=[0, 64]), ValueError,
     "give either block_size or q_bounds"),
    ("BlockMask.from_scipy", "a duplicate entry", lambda: BlockMask.from_scipy(
        sp.coo_array((np.array([1, -1]), (np.array([0, 0]), np.array([1, 1]))), shape=(2, 2)),
        block_size=64), ValueError, "stored twice"),
    ("BlockMask.from_scipy", "a list of arrays", lambda: BlockMask.from_scipy(
        [np.eye(2)], block_size=64), TypeError, "matrices must be a scipy sparse matrix"),
    ("BlockMask.from_indices", "width 0, no num_kv_blocks", lambda: BlockMask.from_indices(
        np.zeros(2, np.int32), np.zeros((2, 0), np.int32), block_size=64), ValueError,
     "pass num_kv_blocks"),
    ("BlockMask.from_indices", "an index out of range", lambda: BlockMask.from_indices(
        np.ones(2, np.int32), np.full((2, 1), 5, np.int32), block_size=64), ValueError,
     "block index out of range"),
    ("BlockMask.from_indices", "a repeated index", lambda: BlockMask.from_indices(
        np.full(2, 2, np.int32), np.zeros((2, 2), np.int32), block_size=64,
        num_kv_blocks=2), ValueError, "selects the same key block twice"),
    ("BlockMask(...)", "batch_heads (0, 1)", lambda: BlockMask(
        M.q_bounds, M.kv_bounds, M.indptr, M.indices, (0, 1)), ValueError,
     "batch_heads must be a"),
    ("BlockMask.head_index", "no kv heads", lambda: M.head_index(2, 0), ValueError,
     "num_kv_heads must be a positive int, got 0"),
    ("BlockMask.head_index", "2.5 query heads", lambda: M.head_index(2.5, 1), TypeError,
     "num_q_heads must be a positive int, got 2.5"),
    ("BlockMask.batch_index", "batch=-1", lambda: M.batch_index(-1), ValueError,
     "batch must be a positive int, got -1"),
    ("BlockMask.selected_pairs", "num_heads=0", lambda: M.selected_pairs(1, 0), ValueError,
     "num_heads must be a positive int, got 0"),
    ("tessera.plan", "a dense array as the mask", lambda: tessera.plan(
        np.ones((2, 2), bool), num_q_heads=1, head_dim=64), TypeError,
     "block_mask must be a tessera.BlockMask"),
    ("tessera.plan", "dtype=float32", lambda: _plan(dtype="float32"), TypeError,
     "dtype must be bfloat16 or float16"),
    ("tessera.plan", "head_dim=80", lambda: _plan(head_dim=80), ValueError,
     r"head_dim 80 is not supported \(supported: \(64, 96, 128\)\)"),
    ("tessera.plan", "head_dim_v=32", lambda: _plan(head_dim_v=32), ValueError,
     "head_dim_v must equal head_dim"),
    ("tessera.plan", "arch='sm_90'", lambda: _plan(arch="sm_90"), ValueError,
     "arch must be None or a compute capability int"),
    ("tessera.plan", "num_q_heads=0", lambda: _plan(num_q_heads=0), ValueError,
     "num_q_heads must be a positive int"),
    ("tessera.plan", "3 query heads over 2 kv heads", lambda: _plan(
        num_q_heads=3, num_kv_heads=2), ValueError, "must be a multiple of num_kv_heads"),
    ("tessera.plan", "layout='bshd'", lambda: _plan(layout="bshd"), ValueError,
     "layout must be 'bhld' or 'blhd'"),
    ("tessera.plan", "regime='fast'", lambda: _plan(regime="fast"), TypeError,
     "regime must be a tessera Regime"),
    ("tessera.plan", "mode=CAPTURE with a host mask", lambda: _plan(
        mode=tessera.PlanMode.CAPTURE), ValueError,
     "block_mask must be on the GPU for a sync-free plan"),
    ("tessera.Regime", "block_m=100", lambda: tessera.Regime(block_m=100), ValueError,
     "block_m must be a positive multiple of 16"),
    ("tessera.Regime", "combine_threshold=nan", lambda: tessera.Regime(
        combine_threshold=float("nan")), ValueError,
     "regime field combine_threshold must be a finite number, got nan"),
    ("tessera.Regime", "block_m=128.0", lambda: tessera.Regime(block_m=128.0), TypeError,
     "regime field block_m must be an int, got 128.0"),
    ("tessera.Regime", "stages=-1", lambda: tessera.Regime(stages=-1), ValueError,
     "stages must be at least 2"),
    ("tessera.plan", "an sm90 regime with arch=80", lambda: _plan(
        regime=tessera.Regime(family="sm90", block_m=128, num_warps=8, block_n=128, stages=3),
        arch=80), ValueError, "runs on sm_90 GPUs only; arch=80 was asked for"),
    ("tessera.plan", "mode='no'", lambda: _plan(mode="no"), TypeError,
     "mode must be None or a tessera.PlanMode"),
    ("BlockMask(...)", "a key block out of range", lambda: BlockMask(
        M.q_bounds, M.kv_bounds, [0, 1, 2], [0, 2], (1, 1)), ValueError,
     r"indices must be key blocks in \[0, 2\): indices\[1\]=2"),
    ("BlockMask(...)", "float indices", lambda: BlockMask(
        M.q_bounds, M.kv_bounds, [0, 1, 2], [0.0, 1.0], (1, 1)), TypeError,
     "indices must hold integers, got dtype float64"),
    ("tessera.attention", "numpy arrays", lambda: tessera.attention(X, X, X, M), ValueError,
     "q is a host \\(numpy\\) array"),
    ("tessera.attention", "None", lambda: tessera.attention(None, None, None, M), TypeError,
     "q must be a CuPy array or a DLPack tensor"),
    ("tessera.attention", "scale=0", lambda: tessera.attention(X, X, X, M, scale=0.0),
     ValueError, "scale must be positive and finite"),
    ("tessera.attention", "a dense array as the mask", lambda: tessera.attention(
        X, X, X, np.ones((2, 2), bool)), TypeError, "block_mask must be a tessera.BlockMask"),
    ("tessera.attention", "precision='fp8'", lambda: tessera.attention(
        X, X, X, M, precision="fp8"), ValueError,
     r"precision must be one of \(None, 'int8', 'int8-qk'\), got 'fp8'"),
    ("tessera.attention", "precision='int8' with a regime", lambda: tessera.attention(
        X, X, X, M, precision="int8", regime="sm90_128x128_w12_s3"), ValueError,
     "regime must be None with precision='int8'"),
    ("Plan.run", "numpy arrays", lambda: _plan().run(X, X, X), ValueError,
     "q is a host \\(numpy\\) array"),
    ("Plan.run", "precision='fp8'", lambda: _plan().run(X, X, X, precision="fp8"), ValueError,
     r"precision must be one of \(None, 'int8', 'int8-qk'\), got 'fp8'"),
    ("launch.check_int8_regime", "64-row tiles", lambda: check_int8_regime(
        tessera.Regime(family="sm90", block_m=64, num_warps=8, block_n=64, stages=3,
                       combine_threshold=0.0), 64), ValueError,
     "regime has an 8-bit form"),
    ("tessera.attention_backward", "numpy arrays", lambda: tessera.attention_backward(
        X, X, X, X, LSE, X, M), ValueError, "q is a host \\(numpy\\) array"),
    ("tessera.attention_backward", "scale=-1", lambda: tessera.attention_backward(
        X, X, X, X, LSE, X, M, scale=-1.0), ValueError, "scale must be positive and finite"),
    ("tessera.attention_backward", "a dense array as the mask", lambda:
        tessera.attention_backward(X, X, X, X, LSE, X, np.ones((2, 2), bool)), TypeError,
     "block_mask must be a tessera.BlockMask"),
    ("Plan.run_backward", "numpy arrays", lambda: _plan().run_backward(X, X, X, X, LSE, X),
     ValueError, "q is a host \\(numpy\\) array"),
    ("tessera.attention_backward", "regime as a name", lambda: tessera.attention_backward(
        X, X, X, X, LSE, X, M, regime="bwd_sm90_128_atomics_tma"), TypeError,
     "regime must be None or a tessera.BackwardRegime, got str"),
    ("Plan.run_backward", "a forward Regime", lambda: _plan().run_backward(
        X, X, X, X, LSE, X, regime=tessera.Regime()), TypeError,
     "regime must be None or a tessera.BackwardRegime, got Regime"),
    ("tessera.BackwardRegime", "block_m=64 with dq='atomics'", lambda: tessera.BackwardRegime(
        block_m=64), ValueError, "dq='atomics' runs in the sm90 family's 128-row tasks only"),
    ("tessera.BackwardRegime", "family='sm80' with tma=True", lambda: tessera.BackwardRegime(
        family="sm80", block_m=64, dq="passes"), ValueError, "tma=True is a copy form"),
    ("tessera.BackwardRegime", "block_m=128.0", lambda: tessera.BackwardRegime(block_m=128.0),
     TypeError, "backward regime field block_m must be an int, got 128.0"),
    ("Plan.replan", "a host plan", lambda: _plan().replan(M), ValueError,
     "only a sync-free device plan can be replanned"),
    ("tessera.reference.attention", "complex q", lambda: tessera.reference.attention(
        X.astype(np.complex64), X, X, M), TypeError, "q must hold real floating"),
    ("tessera.reference.attention", "scale=nan", lambda: tessera.reference.attention(
        X, X, X, M, scale=float("nan")), ValueError, "scale must be positive and finite"),
    ("tessera.reference.attention", "head dim 0", lambda: tessera.reference.attention(
        X[..., :0], X[..., :0], X, M), ValueError, "head dims must be at least 1"),
    ("tessera.reference.attention", "[B, L, H, D] read as bhld", lambda:
        tessera.reference.attention(*(np.zeros((1, 128, 2, 64)),) * 3, M), ValueError,
     "layout='blhd'\\?"),
    ("tessera.reference.attention_backward", "dout of another shape", lambda:
        tessera.reference.attention_backward(X, X, X, X[:, :, :64], M), ValueError,
     r"dout must have the output's shape \(1, 1, 128, 64\)"),
    ("tessera.reference.attention_backward", "no dout", lambda:
        tessera.reference.attention_backward(X, X, X, None, M), TypeError,
     "dout must be an array"),
    ("tessera.reference.attention_rows", "a negative token", lambda:
        tessera.reference.attention_rows(X, X, X, M, np.array([[0, 0, -1]])), ValueError,
     r"rows\[0\]: token -1 is outside \[0, 128\)"),
    ("tessera.reference.attention_rows", "a head out of range", lambda:
        tessera.reference.attention_rows(X, X, X, M, np.array([[0, 0, 5], [0, 1, 5]])),
     ValueError, r"rows\[1\]: query head 1 is outside \[0, 1\)"),
    ("tessera.reference.attention_rows", "rows of two numbers", lambda:
        tessera.reference.attention_rows(X, X, X, M, np.array([[0, 5]])), ValueError,
     r"rows must be \[n, 3\]"),
    ("tessera.reference.attention_rows", "float rows", lambda:
        tessera.reference.attention_rows(X, X, X, M, np.array([[0.0, 0.0, 5.0]])), TypeError,
     "rows must hold ints"),
    ("tessera.emulate.run", "a short k", lambda: tessera.emulate.run(
        _plan(), X, X[:, :, :100], X[:, :, :100]), ValueError, "covers \\(128, 128\\) tokens"),
    ("tessera.emulate.run", "a head dim other than the plan's", lambda: tessera.emulate.run(
        _plan(), *(np.zeros((1, 1, 128, 128)),) * 3), ValueError, "differ from the plan's"),
    ("tessera.emulate.run", "e4m3 scores", lambda: tessera.emulate.run(
        _plan(), X, X, X, scheme=quantization.Scheme(qk="e4m3")), ValueError,
     "scheme must round the scores to int8"),
    ("tessera.emulate.run", "a K step per 16 keys", lambda: tessera.emulate.run(
        _plan(), X, X, X, scheme=quantization.Scheme(k_group=16)), ValueError,
     r"scheme must round the scores to int8 \(a K step a token\)"),
    ("tessera.config", "use_tma='yes'", lambda: setattr(tessera.config, "use_tma", "yes"),
     TypeError, "config.use_tma must be True or False"),
    ("tessera.config", "request_selection_refresh=0", lambda: setattr(
        tessera.config, "request_selection_refresh", 0), ValueError,
     "config.request_selection_refresh must be an int >= 1"),
    ("tessera.config", "an unknown setting", lambda: setattr(tessera.config, "tma", True),
     AttributeError, "tessera.config has no setting 'tma'"),
    ("tessera.config", "override(bogus=1)", lambda: tessera.config.override(
        bogus=1).__enter__(), TypeError, r"config.override got unknown settings \['bogus'\]"),
    ("tessera.use_table", "a folder", lambda: tessera.use_table("/"), ValueError,
     "a folder, not a regime table file"),
    ("tessera.use_table", "a number", lambda: tessera.use_table(3), TypeError,
     "table must be a path, a RegimeTable, None or 'auto', got int"),
    ("tessera.use_table", "a missing file", lambda: tessera.use_table("/nonexistent.json"),
     FileNotFoundError, "nonexistent"),
    ("methods.VideoGeometry", "text_valid past text_tokens", lambda: methods.VideoGeometry(
        (4, 4, 4), 10, 12), ValueError, "text_valid must be None or an int in"),
    ("methods.VideoGeometry", "a 2-D latent", lambda: methods.VideoGeometry((4, 4)),
     ValueError, "latent must be three positive ints"),
    ("methods.TopKCubes", "density and topk", lambda: methods.TopKCubes(density=0.1, topk=3),
     ValueError, "give one of density, topk or top_p"),
    ("methods.TopKCubes", "density=1.5", lambda: methods.TopKCubes(density=1.5), ValueError,
     "density must be in"),
    ("methods.SlidingTile", "tile=(6, 8)", lambda: methods.SlidingTile(tile=(6, 8)),
     ValueError, "tile must be three positive ints"),
    ("methods.SlidingTile", "window=(0, 3, 3)", lambda: methods.SlidingTile(window=(0, 3, 3)),
     ValueError, "window must be three positive ints"),
    ("methods.Radial", "block=-1", lambda: methods.Radial(block=-1), ValueError,
     "block must be a positive int, got -1"),
    ("methods.SemanticClusters", "q_clusters=0", lambda: methods.SemanticClusters(
        q_clusters=0), ValueError, "q_clusters must be a positive int, got 0"),
    ("methods.TopKCubes", "top_p=2.0", lambda: methods.TopKCubes(top_p=2.0), ValueError,
     r"top_p must be in \(0, 1\], got 2.0"),
    ("methods.Schedule", "dense_steps=-1", lambda: methods.Schedule(dense_steps=-1),
     ValueError, "dense_steps must be an int >= 0"),
    ("methods.method_from_name", "an unknown name", lambda: methods.method_from_name("sta"),
     ValueError, "unknown method 'sta'; choose from"),
    ("methods.Schedule.dense", "step='a'", lambda: methods.Schedule(1, 1).dense("a", 1),
     ValueError, "step must be an int >= 0, got 'a'"),
    ("presets.get", "an unknown name", lambda: presets.get("sta"), ValueError,
     "unknown preset 'sta'; choose from hunyuan-768p-sta"),
    ("Method.layer_mask", "ordered='yes'", lambda: methods.Radial().layer_mask(
        methods.VideoGeometry((2, 8, 8)), ordered="yes"), TypeError,
     "ordered must be True or False, got 'yes'"),
    ("Method.layer_mask", "top-k without q and k", lambda: methods.TopKCubes().layer_mask(
        methods.VideoGeometry((4, 4, 4))), ValueError, "builds its mask from q and k"),
    ("distributed.rank_pairs", "mode='auto'", lambda: distributed.rank_pairs(
        M, 2, 1, 1, mode="auto"), ValueError, "mode must be 'ulysses', 'ring' or 'hybrid'"),
    ("distributed.rank_pairs", "ranks=0", lambda: distributed.rank_pairs(
        M, 0, 1, 1, mode="ring"), ValueError, "ranks must be an int >= 1, got 0"),
    ("distributed.rank_pairs", "hybrid, 3 of 4 ranks", lambda: distributed.rank_pairs(
        M, 4, 1, 1, mode="hybrid", ulysses_degree=3), ValueError,
     "ulysses_degree must divide the group's 4 ranks"),
    ("families.topk_pooled", "text_first='yes'", lambda: families.topk_pooled(
        X, X, (1, 8, 16), text_first="yes"), TypeError, "text_first must be True or False"),
    ("families.topk_pooled", "topk=0", lambda: families.topk_pooled(
        X, X, (1, 8, 16), topk=0), ValueError, "topk must be a positive int, got 0"),
    ("families.topk_pooled", "top_p=True", lambda: families.topk_pooled(
        X, X, (1, 8, 16), top_p=True), TypeError,
     r"top_p must be a number in \(0, 1\], got True"),
    ("families.sliding_tile", "text_tokens=2.5", lambda: families.sliding_tile(
        (2, 8, 8), text_tokens=2.5), TypeError, "text_tokens must be an int >= 0, got 2.5"),
    ("families.apply_permutation", "axis=5", lambda: families.apply_permutation(
        np.zeros((2, 3)), np.arange(3), axis=5), ValueError, r"axis must be an int in \[-2, 2\)"),
    ("families.apply_permutation", "a position out of range", lambda: families.apply_permutation(
        np.zeros((2, 3)), np.array([0, 5, 1]), axis=1), ValueError,
     r"perm must hold positions in \[0, 3\)"),
    ("families.tile_permutation", "tile=(0, 1, 1)", lambda: families.tile_permutation(
        (2, 4, 4), (0, 1, 1)), ValueError, "tile must be three positive ints"),
    ("families.invert_permutation", "a repeated entry", lambda: families.invert_permutation(
        np.array([0, 0, 1])), ValueError, "perm must hold each of 0 .. 2 exactly once"),
    ("families.random_blocks", "sizes=(64, 32)", lambda: families.random_blocks(
        2, 4000, sizes=(64, 32)), ValueError,
     r"sizes must be \(lo, hi\) ints with 0 < lo <= hi, or None, got \(64, 32\)"),
    ("families.random_blocks", "density=1.5", lambda: families.random_blocks(
        2, 4000, density=1.5), ValueError, r"density must be in \[0, 1\], got 1.5"),
    ("quantization.Scheme", "qk='fp8'", lambda: quantization.Scheme(qk="fp8"), ValueError,
     r"qk must be one of \('e4m3', 'int8'\), got 'fp8'"),
    ("quantization.Scheme", "chunk_keys=100", lambda: quantization.Scheme(chunk_keys=100),
     ValueError, "chunk_keys must be 64 or 128"),
    ("quantization.Scheme", "k_group=8", lambda: quantization.Scheme(k_group=8),
     ValueError, r"k_group must be one of \(1, 16, 64, 128\)"),
    ("quantization.quantize", "fmt='fp4'", lambda: quantization.quantize(X, "fp4"), ValueError,
     r"fmt must be one of \('e4m3', 'int8'\), got 'fp4'"),
    ("quantization.quantize", "axis=4", lambda: quantization.quantize(X, "int8", 4), ValueError,
     r"axis must be an int \(or ints\) in \[-4, 4\)"),
    ("quantization.round_e4m3", "a string", lambda: quantization.round_e4m3("1.5"), TypeError,
     "x must hold real numbers"),
    ("quantization.rotation", "head_dim=80", lambda: quantization.rotation(80), ValueError,
     "head_dim must be a power of two or a multiple of 32, got 80"),
    ("quantization.attention", "scheme='int8'", lambda: quantization.attention(
        X, X, X, M, scheme="int8"), TypeError, "scheme must be a tessera.quantization.Scheme"),
    ("quantize_launch.quantize_operands", "an e4m3 scheme", lambda: quantize_operands(
        X, X, X, scheme=quantization.Scheme(qk="e4m3")), ValueError,
     r"the GPU pre-pass rounds to int8 only"),
    ("quantize_launch.quantize_operands", "a K step per 16 keys", lambda: quantize_operands(
        X, X, X, scheme=quantization.Scheme(k_group=16)), ValueError,
     r"the GPU pre-pass rounds to int8 only"),
    ("quantize_launch.check_int8", "head_dim=96", lambda: check_int8(96, 90),
     ValueError, r"precision='int8' takes head dims \(64, 128\), got 96"),
    ("quantize_launch.check_int8", "an sm_80 GPU", lambda: check_int8(64, 80),
     ValueError, r"runs on Hopper GPUs \(sm_90\) only"),
    ("quantize_launch.check_int8", "a capture", lambda: check_int8(64, 90, True),
     ValueError, "cannot be captured into a CUDA graph"),
    ("quantize_launch.check_int8", "head_dim=96, int8-qk", lambda: check_int8(
        96, 90, precision="int8-qk"), ValueError,
     r"precision='int8-qk' takes head dims \(64, 128\), got 96"),
    ("quantize_launch.v_key_order", "keys=40", lambda: v_key_order(40), ValueError,
     "keys must be a non-negative multiple of 16, got 40"),
    ("distributed.head_units", "balance='even'", lambda: distributed.head_units(
        M, M.to_dense(), 1, 2, "even"), ValueError,
     r"balance must be one of \('pairs', 'heads'\), got 'even'"),
]


@pytest.mark.parametrize("entry, what, call, kind, words", CASES,
                         ids=[f"{c[0]}: {c[1]}" for c in CASES])
def test_bad_input_refused_by_name(entry, what, call, kind, words):
    with pytest.raises(kind, match=words):
        call()


def doc_row(entry: str, what: str, call) -> str:
    """The row of docs/errors.md for a case: the error raised and its whole message."""
    try:
        call()
    except Exception as exc:  # noqa: BLE001 - the row records whatever it is
        message = str(exc).replace("|", "\\|")
        return f"| `{entry}` | {what} | `{type(exc).__name__}` | {message} |"
    raise AssertionError(f"{entry}: {what} raised nothing")


def test_the_docs_table_shows_every_case_and_its_whole_message():
    """docs/errors.md shows each case with the error it raises and its whole message, as
    raised: a case added here and not there, or a message changed, fails."""
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[1] / "docs" / "errors.md").read_text()
    missing = [row for e, w, call, *_ in CASES if (row := doc_row(e, w, call)) not in doc]
    assert not missing, "\n".join(missing)
