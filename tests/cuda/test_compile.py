"""CI (no GPU needed): every kernel variant compiles for every target with no register spills,
and the loader's error paths say what is wrong."""

from __future__ import annotations

import pytest

from tessera.cuda import loader, variants
from tessera.runtime.regime import Regime, default_regime, regime_fits

pytest.importorskip("cupy_backends.cuda.libs.nvrtc", reason="NVRTC comes with the CUDA extras")

HEAD_DIMS = (64, 96, 128)


def _regimes():
    """Every regime the runtime can pick by default, per target."""
    out = {}
    for target, cc in (("sm_80", 80), ("sm_86", 86), ("sm_89", 89), ("sm_90a", 90),
                       ("sm_100a", 100)):
        for d in HEAD_DIMS:
            out.setdefault(target, set()).add((default_regime(cc, d), d))
    return out


VARIANTS = [(t, r, d, bf16) for t, rs in sorted(_regimes().items())
            for r, d in sorted(rs, key=lambda x: (x[0].name, x[1])) for bf16 in (True, False)]


@pytest.mark.parametrize("target,regime,d,bf16", VARIANTS,
                         ids=[f"{t}-{r.name}-d{d}-{'bf16' if b else 'fp16'}"
                              for t, r, d, b in VARIANTS])
def test_bsa_variant_compiles_without_spills(target, regime, d, bf16, tmp_path, monkeypatch):
    monkeypatch.setenv("TESSERA_CACHE_DIR", str(tmp_path))
    v = regime.variant(d, bf16)
    res = loader.compile_variant(v, target)  # raises BuildError on any spill
    assert res.spill_bytes == 0 and res.stack_bytes <= res.variant.local_bytes
    assert res.registers <= 255 and len(res.cubin) > 1000
    # The kernel's shared memory must fit the smallest per-CTA limit of the target (sm_86/89).
    limit = {"sm_86": 101376, "sm_89": 101376}.get(target, 166912)
    if regime.family == "sm90":
        limit = 232448
    assert variants.smem_bytes(v) <= limit


SM90_SHAPES = [(bm, bn, d, stages) for bm in (64, 128) for bn in (64, 128)
               for d in HEAD_DIMS for stages in (3, 4)
               if regime_fits(Regime(family="sm90", block_m=bm, num_warps=bm // 16, block_n=bn,
                                     stages=stages), d, 90)]


@pytest.mark.parametrize("bm,bn,d,stages", SM90_SHAPES,
                         ids=[f"{bm}x{bn}-d{d}-s{s}" for bm, bn, d, s in SM90_SHAPES])
def test_sm90_variants_compile_without_spills(bm, bn, d, stages, tmp_path, monkeypatch):
    """Every tile shape of the Hopper family that fits in shared memory builds for sm_90a with
    no spills and no serialized wgmma (the loader refuses both)."""
    monkeypatch.setenv("TESSERA_CACHE_DIR", str(tmp_path))
    for bf16 in (True, False):
        v = variants.Variant.bsa_sm90(block_m=bm, block_n=bn, head_dim=d, stages=stages, bf16=bf16)
        res = loader.compile_variant(v, "sm_90a")
        assert res.spill_bytes == 0 and res.stack_bytes <= res.variant.local_bytes
        assert res.registers <= 255


@pytest.mark.parametrize("bm,bn,d", [(128, 128, 128), (128, 64, 128), (128, 128, 96),
                                     (128, 128, 64), (64, 128, 64), (64, 64, 128),
                                     (64, 128, 128), (64, 64, 64), (64, 64, 96)])
def test_sm90_producer_variants_compile(bm, bn, d, tmp_path, monkeypatch):
    """The warp-specialized variant (a producer warpgroup, register reallocation): no spills,
    no serialized wgmma, setmaxnreg honoured (the loader refuses all three)."""
    monkeypatch.setenv("TESSERA_CACHE_DIR", str(tmp_path))
    reg = Regime(family="sm90", block_m=bm, num_warps=bm // 16 + 4, block_n=bn, stages=3)
    assert reg.producer and regime_fits(reg, d, 90)
    v = reg.variant(d, bf16=True)
    assert v.threads == (bm // 64 + 1) * 128
    res = loader.compile_variant(v, "sm_90a")
    assert res.spill_bytes == 0 and res.stack_bytes <= res.variant.local_bytes
    # A second Q buffer where it fits sm_90's shared memory (not at head dim 128 with 128-key
    # steps: Wan's and HunyuanVideo's default); barriers for the stage and Q hand-overs and the
    # task-index words after the tiles.
    plain = Regime(family="sm90", block_m=bm, num_warps=bm // 16, block_n=bn, stages=3)
    q_bufs = dict(v.macros).get("Q_BUFFERS", 1)
    aligned = dict(v.macros).get("SMEM_ALIGNED", 0)
    with_two = variants.smem_bytes(plain.variant(d)) + bm * d * 2 + 8 * (2 * 3 + 2 * 2 + 2)
    # (two CTAs an SM with one Q buffer beat one CTA with two; a two-CTA variant without the
    # alignment slack keeps two Q buffers where they fit: 128-key steps at head dim 64)
    if aligned:
        assert q_bufs == (1 if d == 128 else 2)
    else:
        assert (q_bufs == 2) == (with_two <= 227 * 1024)
    if (bm, bn, d) == (128, 128, 128):
        assert q_bufs == 1
    # The tiles, the barriers and task-index words, and (unless SMEM_ALIGNED) 1 KB of slack.
    assert variants.smem_bytes(v) == (variants.smem_bytes(plain.variant(d))
                                      + (q_bufs - 1) * bm * d * 2
                                    + 8 * (2 * 3 + 2 * q_bufs + 2) - 1024 * aligned)
    if (bm, bn, d) == (128, 128, 64):  # CogVideoX's aligned tiles
        assert q_bufs == 2
    assert v.persistent and not plain.variant(d).persistent
    # 64-row tiles split the registers for two CTAs an SM wherever that fits in shared memory:
    # 64x64 with two Q buffers at head dims 64 and 96, and at 128 with one and no alignment
    # slack; 64x128 at head dim 64 with two and no slack (the loader checked the launch
    # registers: 128, not 255).
    two_ctas = bm == 64 and (bn == 64 or d == 64)
    assert v.min_blocks == (2 if two_ctas else 1)
    assert aligned == ((bm, bn, d) in ((64, 64, 128), (64, 128, 64)))
    if v.min_blocks == 2:
        assert res.registers <= 128 and 2 * (variants.smem_bytes(v) + 1024) <= 228 * 1024


@pytest.mark.parametrize("bm,bn,d", [(128, 128, 64), (128, 128, 96), (128, 128, 128),
                                     (128, 64, 128), (64, 64, 64), (64, 64, 128), (64, 128, 128),
                                     (64, 128, 64), (64, 128, 96),
                                     (192, 64, 64), (192, 64, 96), (192, 64, 128)])
def test_sm90_tma_variants_compile(bm, bn, d, tmp_path, monkeypatch):
    """The TMA-copying producer variants (one thread issues Q and K/V copies; the producer
    warpgroup keeps 24 registers): spill-free, wgmma not serialized -- at head dim 128 with
    128-key steps too, where the consumers' 240 registers now hold P, S and O at once. 64-row
    tiles split the registers for two CTAs an SM wherever their shared memory fits: 64x128 at
    head dim 64 with two Q buffers and no alignment slack; 64x64 at head dim 64 for three CTAs
    an SM (80 registers at launch, the consumers raised to 136)."""
    monkeypatch.setenv("TESSERA_CACHE_DIR", str(tmp_path))
    reg = Regime(family="sm90", block_m=bm, num_warps=bm // 16 + 4, block_n=bn, stages=3,
                 combine_threshold=0.0)
    assert reg.tma_capable and not reg.with_(pack_keys=True).tma_capable
    v = reg.variant(d, bf16=True, tma=True)
    assert v.tma and not reg.variant(d).tma and v.persistent
    res = loader.compile_variant(v, "sm_90a")
    assert res.spill_bytes == 0 and res.stack_bytes <= res.variant.local_bytes
    three_ctas = (bm, bn, d) == (64, 64, 64)
    two_ctas = bm == 64 and (bn == 64 or d == 64) and not three_ctas
    assert v.min_blocks == (3 if three_ctas else 2 if two_ctas else 1)
    if three_ctas:
        assert res.registers <= 80 and 3 * (variants.smem_bytes(v) + 1024) <= 228 * 1024
        assert reg.variant(d, bf16=True).min_blocks == 2  # cp.async: too few registers left
    if two_ctas:
        assert res.registers <= 128 and 2 * (variants.smem_bytes(v) + 1024) <= 228 * 1024
        assert dict(v.macros).get("SMEM_ALIGNED", 0) == ((bm, bn) == (64, 128) or d == 128)
        assert dict(v.macros).get("Q_BUFFERS", 1) == (1 if d == 128 else 2)
    with pytest.raises(ValueError, match="producer's"):
        variants.Variant.bsa_sm90(block_m=bm, block_n=bn, head_dim=d, stages=3, bf16=True,
                                producer=True, pack_keys=True, tma=True)


@pytest.mark.parametrize("d", [64, 128])
def test_sm90_tma_variants_count_a_chunk_word_a_stage(d):
    """A TMA producer stages each chunk's span fields in a 16-byte word a stage after the
    barriers (sm90/walks.cuh, STAGED_SPANS): its shared memory is the cp.async form's plus those
    words, and the 64-row forms still fit their CTAs an SM with them."""
    from tessera.cuda.device import SM90_SMEM_PER_SM, SM90_SMEM_RESERVED

    for bm, bn in ((128, 128), (64, 64), (64, 128)):
        reg = Regime(family="sm90", block_m=bm, num_warps=bm // 16 + 4, block_n=bn, stages=3,
                     combine_threshold=0.0)
        tma, cp = reg.variant(d, bf16=True, tma=True), reg.variant(d, bf16=True)
        assert tma.tma and not cp.tma
        fits = tma.min_blocks * (variants.smem_bytes(tma) + SM90_SMEM_RESERVED)
        assert fits <= SM90_SMEM_PER_SM, (bm, bn, d)
        rest = lambda v: {k: x for k, x in v.macros if k not in ("TMA", "PV_WAIT_ANCHOR")}
        if rest(tma) == rest(cp):  # (the 64x64 head-dim-64 TMA form splits for three CTAs)
            assert variants.smem_bytes(tma) == variants.smem_bytes(cp) + 16 * 3, (bm, bn, d)


@pytest.mark.parametrize("rings,bn,d,q_buffers", [(4, 64, 64, 1), (3, 64, 64, 2),
                                                (2, 64, 128, 1), (2, 128, 64, 2)])
def test_sm90_ring_variants_compile(rings, bn, d, q_buffers, tmp_path, monkeypatch):
    """Rings (64-row TMA producer tiles, 12-20 warps): one CTA an SM whose shared memory holds
    every ring's Q buffers (two where they fit), stages and barriers, spill-free under the
    register split of 128 x (rings + 1) threads; the cp.async form of the same regime runs one
    ring; rings where a CTA cannot hold them are refused."""
    from tessera.cuda.device import SM90_SMEM_PER_SM, SM90_SMEM_RESERVED

    monkeypatch.setenv("TESSERA_CACHE_DIR", str(tmp_path))
    reg = Regime(family="sm90", block_m=64, num_warps=4 * rings + 4, block_n=bn, stages=3,
                 combine_threshold=0.0)
    assert reg.producer and reg.rings == rings
    v = reg.variant(d, bf16=True, tma=True)
    assert (v.rings, v.threads, v.min_blocks) == (rings, 128 * (rings + 1), 1)
    assert dict(v.macros).get("Q_BUFFERS", 1) == q_buffers
    one = reg.with_(num_warps=8).variant(d, bf16=True, tma=True)
    per_ring = variants.smem_bytes(one) - (0 if dict(one.macros).get("SMEM_ALIGNED") else 1024)
    if dict(one.macros).get("Q_BUFFERS", 1) == q_buffers:
        assert variants.smem_bytes(v) == 1024 + rings * per_ring
    assert variants.smem_bytes(v) + SM90_SMEM_RESERVED <= SM90_SMEM_PER_SM
    assert reg.variant(d, bf16=True).rings == 1
    res = loader.compile_variant(v, "sm_90a")
    assert res.spill_bytes == 0 and res.stack_bytes <= res.variant.local_bytes
    assert res.registers <= 65536 // v.threads
    assert not regime_fits(reg.with_(num_warps=16), 96, 90)  # three rings at head dim 96
    with pytest.raises(ValueError, match="rings"):
        variants.Variant.bsa_sm90(block_m=128, block_n=bn, head_dim=d, stages=3, bf16=True,
                                  producer=True, tma=True, rings=2)
    with pytest.raises(ValueError, match="block_m"):
        Regime(family="sm90", block_m=128, num_warps=20, block_n=bn, stages=3)


@pytest.mark.parametrize("bf16", [True, False])
def test_sm90_wide_step_variant_compiles(bf16, tmp_path, monkeypatch):
    """Regime.wide_steps at head dim 64: the TMA variant with 192-key steps beside its 128-key
    ones (two instantiations of the task loop, stages of 192 keys) builds without spills or
    serialized wgmma, its task rule set from the host's mirror (tasks.wide_step_tasks);
    elsewhere the flag leaves the variant as it was."""
    monkeypatch.setenv("TESSERA_CACHE_DIR", str(tmp_path))
    reg = Regime(family="sm90", block_m=128, num_warps=12, block_n=128, stages=3,
                 combine_threshold=0.0, wide_steps=True)
    v = reg.variant(64, bf16=bf16, tma=True)
    assert dict(v.macros)["WIDE_BN"] == variants.WIDE_BN and v.kv_rows == 192
    from tessera.runtime import tasks  # the rule's one source: the host mirror's constants

    config = variants.config_header(v)
    assert f"WIDE_SPANS = {tasks.WIDE_SPANS};" in config
    assert f"WIDE_SLACK = {tasks.WIDE_SLACK};" in config
    assert v.kv_box_rows == 64 and variants.smem_bytes(v) <= 227 * 1024
    for other in (reg.variant(64, bf16=bf16), reg.variant(128, bf16=bf16, tma=True)):
        assert "WIDE_BN" not in dict(other.macros)
    res = loader.compile_variant(v, "sm_90a")
    assert res.spill_bytes == 0 and res.stack_bytes <= res.variant.local_bytes


def _sm90_reachable():
    """Every sm90 kernel a plan on sm_90 can choose (tools.kernels.variants_in_use), in bf16:
    the element type changes no code path."""
    from tessera.tools.kernels import variants_in_use

    return [v for _, v in variants_in_use(("sm_90a",), bf16=(True,))]


SM90_REACHABLE = _sm90_reachable()


@pytest.mark.parametrize("variant", SM90_REACHABLE, ids=[v.label for v in SM90_REACHABLE])
def test_every_sm90_kernel_a_plan_can_choose_compiles(variant, tmp_path, monkeypatch):
    """No spill, no serialized wgmma, setmaxnreg honoured (the loader refuses all three) for
    every sm90 variant reachable from planning, whatever the lists above pick by hand."""
    monkeypatch.setenv("TESSERA_CACHE_DIR", str(tmp_path))
    res = loader.compile_variant(variant, "sm_90a")
    assert res.spill_bytes == 0 and res.stack_bytes <= res.variant.local_bytes


@pytest.mark.parametrize("d", [64, 96])
@pytest.mark.parametrize("pack", [False, True])
def test_sm90_three_warpgroup_variants_compile(d, pack, tmp_path, monkeypatch):
    """192-row tiles (three consumer warpgroups taking turns, a producer): spill-free with
    64-key steps at head dims 64 and 96 (128-key steps need a leaner producer: ptxas serializes
    the wgmma or spills the producer), launched with 128 registers a thread."""
    monkeypatch.setenv("TESSERA_CACHE_DIR", str(tmp_path))
    reg = Regime(family="sm90", block_m=192, num_warps=16, block_n=64, stages=3,
                 combine_threshold=0.0, pack_keys=pack)
    assert regime_fits(reg, d, 90)
    res = loader.compile_variant(reg.variant(d, bf16=True), "sm_90a")
    assert res.spill_bytes == 0 and res.stack_bytes <= res.variant.local_bytes
    assert res.registers == 128


@pytest.mark.parametrize("bm,bn,d,producer", [(64, 64, 64, False), (64, 128, 128, False),
                                                (128, 128, 128, False), (128, 128, 128, True),
                                                (128, 128, 64, True), (128, 64, 128, True),
                                                (128, 128, 96, True), (64, 128, 64, True)])
def test_sm90_packed_key_variants_compile(bm, bn, d, producer, tmp_path, monkeypatch):
    """The packed key walk (Regime.pack_keys) builds for sm_90a with no spills, the producer's
    row cursor included."""
    monkeypatch.setenv("TESSERA_CACHE_DIR", str(tmp_path))
    reg = Regime(family="sm90", block_m=bm, num_warps=bm // 16 + (4 if producer else 0),
                 block_n=bn, stages=3, combine_threshold=0.0, pack_keys=True)
    v = reg.variant(d, bf16=True)
    assert dict(v.macros)["PACK_KEYS"] == 1
    res = loader.compile_variant(v, "sm_90a")
    assert res.spill_bytes == 0 and res.stack_bytes <= res.variant.local_bytes


def test_sm90_family_is_refused_off_hopper(tmp_path, monkeypatch):
    monkeypatch.setenv("TESSERA_CACHE_DIR", str(tmp_path))
    v = variants.Variant.bsa_sm90(block_m=128, block_n=128, head_dim=128, stages=3, bf16=True)
    with pytest.raises(loader.BuildError, match="sm_90a"):
        loader.compile_variant(v, "sm_80")


def test_wgmma_header_is_generated():
    """sm90/wgmma.cuh is exactly what its generator writes (edit the generator, not the header)."""
    from tessera.cuda import gen_wgmma

    assert gen_wgmma.header_path().read_text() == gen_wgmma.render()


@pytest.mark.parametrize("target", loader.CI_TARGETS)
@pytest.mark.parametrize("bf16", [True, False])
def test_combine_compiles(target, bf16, tmp_path, monkeypatch):
    monkeypatch.setenv("TESSERA_CACHE_DIR", str(tmp_path))
    res = loader.compile_variant(variants.Variant.combine(bf16=bf16), target)
    assert res.spill_bytes == 0


def test_cache_roundtrip(tmp_path, monkeypatch):
    monkeypatch.setenv("TESSERA_CACHE_DIR", str(tmp_path))
    v = variants.Variant.combine(bf16=True)
    first = loader.compile_variant(v, "sm_80")
    assert list(tmp_path.glob("*.cubin"))
    second = loader.compile_variant(v, "sm_80")
    assert second.cubin == first.cubin and second.registers == first.registers


def test_compile_error_is_reported(tmp_path, monkeypatch):
    monkeypatch.setenv("TESSERA_CACHE_DIR", str(tmp_path))
    bad = variants.Variant(variants.SM80, "bsa_fwd_sm80", (("BM", 100), ("BN", 64), ("D", 64),
                                                         ("WARPS", 4), ("MT", 2),
                                                         ("STAGES", 2), ("BF16", 1)))
    with pytest.raises(loader.BuildError, match="failed to compile"):
        loader.compile_variant(bad, "sm_80")


def test_spills_are_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("TESSERA_CACHE_DIR", str(tmp_path))
    # 8 warps with two row tiles each and a 2-CTA register cap cannot hold head dim 128.
    v = variants.Variant.bsa_sm80(block_m=256, block_n=64, head_dim=128, num_warps=8, stages=2,
                                bf16=True, min_blocks=2)
    with pytest.raises(loader.BuildError, match="spills registers"):
        loader.compile_variant(v, "sm_80")


def test_local_memory_beyond_the_variants_own_is_refused(tmp_path, monkeypatch):
    """The sm90 family's one local array (the guarded rows' copy) is what its stack frame
    holds; a build with more -- here, with that copy not counted -- is refused like a spill."""
    monkeypatch.setenv("TESSERA_CACHE_DIR", str(tmp_path))
    v = variants.Variant.bsa_sm90(block_m=128, block_n=128, head_dim=128, stages=3, bf16=True)
    assert loader.compile_variant(v, "sm_90a").stack_bytes == v.local_bytes == 256
    monkeypatch.setattr(variants.Variant, "local_bytes", property(lambda self: 0))
    with pytest.raises(loader.BuildError, match="local memory"):
        loader.compile_variant(v, "sm_90a", use_cache=False)


def test_missing_source_is_reported():
    with pytest.raises(loader.BuildError, match="not found"):
        loader.compile_variant(variants.Variant("nope.cu", "k"), "sm_80")


def test_variant_config_holds_every_parameter_and_refuses_unknown_ones():
    """The Config struct a source reads (variant.cuh): each of its parameters, the variant's
    values over the defaults; a value the source does not take, or a required one left out,
    is refused before anything compiles."""
    v = variants.Variant.bsa_sm90(block_m=64, block_n=64, head_dim=64, stages=3, bf16=False,
                                  producer=True, tma=True, rings=4)
    text = variants.config_header(v)
    for name, default in variants.PARAMETERS[variants.SM90].items():
        want = dict(v.macros).get(name, default)
        assert f"  static constexpr int {name} = {want};\n" in text
    assert "RINGS = 4;" in text and "BF16 = 0;" in text and "PACK_KEYS = 0;" in text
    typo = variants.Variant(variants.SM90, "bsa_fwd_sm90", v.macros + (("RING", 2),))
    with pytest.raises(loader.BuildError, match="takes no parameter RING"):
        loader.compile_variant(typo, "sm_90a")
    short = variants.Variant(variants.SM80, "bsa_fwd_sm80", (("BM", 64),))
    with pytest.raises(ValueError, match="leaves BN, D, WARPS, MT, STAGES, BF16 unset"):
        variants.config_header(short)
    with pytest.raises(ValueError, match="is none of"):
        variants.config_header(variants.Variant("other.cu", "k"))


def test_target_for():
    assert loader.target_for(90) == "sm_90a"
    assert loader.target_for(86) == "sm_86"
    assert loader.target_for(100) == "sm_100a"


def test_regime_validation():
    with pytest.raises(ValueError, match="block_m"):
        Regime(block_m=100)
    with pytest.raises(ValueError, match="rows per warp"):
        Regime(block_m=128, num_warps=2)
    assert default_regime(89, 128).block_m == 64
    assert Regime().name.startswith("sm80_128x64_w4_s2")


@pytest.mark.parametrize("kernel", ["plan_row_stats", "plan_write_spans", "plan_scan",
                                    "plan_write_runs", "plan_aligned_spans", "mask_pairs",
                                    "tiling_pairs"])
@pytest.mark.parametrize("target", loader.CI_TARGETS)
def test_planner_kernels_compile(kernel, target, tmp_path, monkeypatch):
    monkeypatch.setenv("TESSERA_CACHE_DIR", str(tmp_path))
    res = loader.compile_variant(variants.Variant("plan.cu", kernel), target)
    assert res.spill_bytes == 0 and f"'{kernel}'" in res.log


@pytest.mark.parametrize("kernel,element", [("cube_pool", "bfloat16"), ("cube_pool", "float16"),
                                            ("cube_pool", "float32"), ("cube_scores", "float32"),
                                            ("topk_rows", "float32")])
@pytest.mark.parametrize("target", loader.CI_TARGETS)
def test_pooled_topk_kernels_compile(kernel, element, target, tmp_path, monkeypatch):
    """The device's pooled top-k mask kernels build spill-free for every target."""
    monkeypatch.setenv("TESSERA_CACHE_DIR", str(tmp_path))
    res = loader.compile_variant(variants.Variant.pooled_topk(kernel, element), target)
    assert res.spill_bytes == 0 and res.stack_bytes == 0 and f"'{kernel}'" in res.log
    with pytest.raises(ValueError, match="cube_pool"):
        variants.Variant.pooled_topk("topk")
    with pytest.raises(ValueError, match="float64"):
        variants.Variant.pooled_topk("cube_pool", "float64")


def test_one_module_two_kernels_reports_each(tmp_path, monkeypatch):
    monkeypatch.setenv("TESSERA_CACHE_DIR", str(tmp_path))
    a = loader.compile_variant(variants.Variant("plan.cu", "plan_row_stats"), "sm_80")
    b = loader.compile_variant(variants.Variant("plan.cu", "plan_write_spans"), "sm_80")
    assert a.cubin == b.cubin  # one module
    assert len(list(tmp_path.glob("*.cubin"))) == 1


def test_missing_report_is_an_error_unless_waived(tmp_path, monkeypatch):
    monkeypatch.setenv("TESSERA_CACHE_DIR", str(tmp_path))
    v = variants.Variant.combine(bf16=True)
    res = loader.compile_variant(v, "sm_80")
    # Simulate NVRTC returning no ptxas report: the cached log is what the next build reads.
    loader._built.clear()
    for log in tmp_path.glob("*.log"):
        log.write_text("")
    with pytest.raises(loader.BuildError, match="resource report"):
        loader.compile_variant(v, "sm_80")
    loader._built.clear()
    waived = loader.compile_variant(v, "sm_80", require_report=False)
    assert waived.cubin == res.cubin and waived.registers == -1
    # A log with a compiler warning but no report (as the H200 machine's NVRTC gave for a
    # program compiled before on the machine): waived too; a report without this kernel's
    # resources is still an error.
    warning = 'combine.cu(3): warning #177-D: function "f" was declared but never referenced\n'
    for log in tmp_path.glob("*.log"):
        log.write_text(warning)
    loader._built.clear()
    with pytest.raises(loader.BuildError, match="resource report"):
        loader.compile_variant(v, "sm_80")
    loader._built.clear()
    assert loader.compile_variant(v, "sm_80", require_report=False).registers == -1
    for log in tmp_path.glob("*.log"):
        log.write_text(warning + "ptxas info    : Compiling entry function 'other' for 'sm_80'\n")
    loader._built.clear()
    with pytest.raises(loader.BuildError, match="resource report"):
        loader.compile_variant(v, "sm_80", require_report=False)
    loader._built.clear()


def test_small_query_blocks_get_64_row_tiles():
    assert default_regime(90, 128, q_block=64).block_m == 64
    assert default_regime(90, 128, q_block=128).block_m == 128


def test_cache_files_are_written_whole_or_not_at_all(tmp_path, monkeypatch):
    """Cubins and their logs reach the cache through a temporary file and a rename: a write
    that fails leaves the old file (or none) and no temporary behind, so a process loading
    while another writes (torchrun) never reads half a file."""
    import os

    target = tmp_path / "k.cubin"
    loader._write_atomic(target, b"first")
    assert target.read_bytes() == b"first"
    loader._write_atomic(target, b"second")
    assert target.read_bytes() == b"second" and [p.name for p in tmp_path.iterdir()] == ["k.cubin"]

    def fail(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", fail)
    with pytest.raises(OSError, match="disk full"):
        loader._write_atomic(target, b"third, cut short")
    assert target.read_bytes() == b"second" and [p.name for p in tmp_path.iterdir()] == ["k.cubin"]


def test_pv_wait_anchor_only_where_it_pays(tmp_path, monkeypatch):
    """The TMA forms of 64x64 tiles and of the whole-span loop at head dim 128 build with their
    exponentials kept ahead of the P V wait (variants.pv_wait_anchored), spill-free and
    unserialized; their cp.async forms and other shapes build without it."""
    monkeypatch.setenv("TESSERA_CACHE_DIR", str(tmp_path))
    reg = Regime(family="sm90", block_m=64, block_n=64, num_warps=8, stages=3,
                 combine_threshold=0.0)
    anchored = reg.variant(128, True, tma=True)
    assert dict(anchored.macros).get("PV_WAIT_ANCHOR") == 1
    assert "PV_WAIT_ANCHOR" not in dict(reg.variant(128, True, tma=False).macros)
    assert "PV_WAIT_ANCHOR" not in dict(reg.variant(64, True, tma=True).macros)
    rows128 = Regime(family="sm90", block_m=128, num_warps=12, block_n=128, stages=3)
    assert "PV_WAIT_ANCHOR" not in dict(rows128.variant(128, True, tma=True).macros)
    # The whole-span loop of a dense layer at head dim 128 keeps them ahead too.
    whole = rows128.with_(combine_threshold=0.0, whole_spans=True)
    assert dict(whole.variant(128, True, tma=True).macros).get("PV_WAIT_ANCHOR") == 1
    assert "PV_WAIT_ANCHOR" not in dict(whole.variant(128, True, tma=False).macros)
    assert "PV_WAIT_ANCHOR" not in dict(whole.variant(64, True, tma=True).macros)
    for v in (anchored, whole.variant(128, True, tma=True)):
        assert loader.compile_variant(v, "sm_90a").spill_bytes == 0


def test_every_kernel_source_ships_in_the_package():
    """Each .cu and .cuh file the loader may read matches the package data pyproject.toml
    ships (a real install, not only the source tree, must build every kernel)."""
    import fnmatch
    from pathlib import Path

    tomllib = pytest.importorskip("tomllib")
    root = Path(loader.SOURCE_DIR)
    project = tomllib.loads((root.parents[1] / "pyproject.toml").read_text())
    globs = project["tool"]["setuptools"]["package-data"]["tessera.cuda"]
    sources = [p.relative_to(root).as_posix() for p in root.rglob("*.cu*")]
    assert len(sources) > 20
    missing = [s for s in sources if not any(fnmatch.fnmatch(s, g) and s.count("/") ==
                                             g.count("/") for g in globs)]
    assert not missing, missing


BACKWARD = [(t, kernel, d) for t in loader.CI_TARGETS
            for kernel in variants.BACKWARD_KERNELS + ("bsa_bwd_delta", "bsa_bwd_dq_convert")
            for d in HEAD_DIMS]


@pytest.mark.parametrize("target,kernel,d", BACKWARD,
                         ids=[f"{t}-{k}-d{d}" for t, k, d in BACKWARD])
def test_backward_kernels_compile_without_spills(target, kernel, d, tmp_path, monkeypatch):
    """Every portable backward kernel (bwd_rows.cu, sm80/bwd_*.cu) builds for every target in
    both element types with no spills, and fits the target's shared memory: the dQ kernel at
    the key step the launch takes there (runtime.regime.backward.dq_block_n)."""
    from tessera.runtime.regime.backward import dq_block_n

    monkeypatch.setenv("TESSERA_CACHE_DIR", str(tmp_path))
    cc = int(target[3:].rstrip("a"))
    bn = dq_block_n(d, cc) if kernel == "bsa_bwd_dq_sm80" else None
    for bf16 in (True, False):
        v = (variants.Variant.bwd_delta(head_dim=d, bf16=bf16) if kernel == "bsa_bwd_delta"
             else variants.Variant.bwd_dq_convert(head_dim=d, bf16=bf16)
             if kernel == "bsa_bwd_dq_convert"
             else variants.Variant.bwd_sm80(kernel, head_dim=d, bf16=bf16, block_n=bn))
        res = loader.compile_variant(v, target)
        assert res.spill_bytes == 0 and res.stack_bytes == 0 and res.registers <= 255
        limit = {"sm_86": 101376, "sm_89": 101376}.get(target, 166912)
        assert variants.smem_bytes(v) <= limit


PRE_PASS = [(t, d) for t in loader.CI_TARGETS for d in HEAD_DIMS]


@pytest.mark.parametrize("target,d", PRE_PASS, ids=[f"{t}-d{d}" for t, d in PRE_PASS])
def test_quantize_kernels_compile_without_spills(target, d, tmp_path, monkeypatch):
    """The 8-bit forward's pre-pass (quantize.cu) builds for every target in both element
    types with no spills."""
    monkeypatch.setenv("TESSERA_CACHE_DIR", str(tmp_path))
    for kernel in variants.QUANTIZE_KERNELS:
        for bf16 in (True, False):
            res = loader.compile_variant(variants.Variant.quantize(kernel, head_dim=d, bf16=bf16),
                                         target)
            assert res.spill_bytes == 0 and res.stack_bytes == 0 and res.registers <= 255


SM90_BACKWARD = [(k, d, det, tma, rows) for k in variants.SM90_BACKWARD_KERNELS
                 for d in HEAD_DIMS for det in (False, True) for tma in (False, True)
                 for rows in (128, 64) if det or (k == "bsa_bwd_dkdv_sm90" and rows == 128)]


@pytest.mark.parametrize("kernel,d,deterministic,tma,rows", SM90_BACKWARD,
                         ids=[f"{k}-d{d}-{'two-pass' if det else 'atomic'}-"
                              f"{'tma' if tma else 'cp.async'}-bm{rows}"
                              for k, d, det, tma, rows in SM90_BACKWARD])
def test_sm90_backward_kernels_compile_without_spills(kernel, d, deterministic, tma, rows,
                                                      tmp_path, monkeypatch):
    """The Hopper backward (sm90/bwd_*.cu) at the launch's tiles for sm_90 -- the dK/dV kernel
    with dQ by atomics (128-row tasks), and both kernels of the deterministic two passes; chunks
    by cp.async and by TMA; 128- and 64-row tasks -- builds for sm_90a in both element types:
    no spills, no serialized wgmma (the loader refuses both), within the per-block shared
    memory, and the 64-row tasks' two CTAs within an SM's."""
    from tessera.runtime.regime.backward import BackwardRegime

    monkeypatch.setenv("TESSERA_CACHE_DIR", str(tmp_path))
    regime = BackwardRegime("sm90", rows, "passes" if deterministic else "atomics", tma)
    for bf16 in (True, False):
        v = next(x for x in regime.kernels(d, bf16, 90) if x is not None and x.kernel == kernel)
        assert bool(dict(v.macros).get("ATOMIC_DQ")) == (not deterministic)
        assert bool(dict(v.macros).get("TMA")) == tma
        res = loader.compile_variant(v, "sm_90a")
        assert res.spill_bytes == 0 and res.stack_bytes == 0 and res.registers <= 255
        assert variants.smem_bytes(v) <= 232448
        if v.macro("BM") == 64:
            assert 2 * (variants.smem_bytes(v) + 1024) <= 233472  # 1 KiB a CTA reserved


@pytest.mark.parametrize("d,tma", [(64, False), (64, True), (128, False), (128, True)])
def test_two_partial_dq_sets_compile_without_spills(d, tma, tmp_path, monkeypatch):
    """The atomic dK/dV kernel with two sets of partial-dQ tiles builds for sm_90a with no
    spills and fits an SM's shared memory: at head dim 64 beside three stages, at 128 in place
    of the third; head dim 96 refuses it by name."""
    monkeypatch.setenv("TESSERA_CACHE_DIR", str(tmp_path))
    for bf16 in (True, False):
        v = variants.Variant.bwd_sm90("bsa_bwd_dkdv_sm90", head_dim=d, bf16=bf16, atomic_dq=True,
                                      tma=tma, dq_buffers=2)
        res = loader.compile_variant(v, "sm_90a")
        assert res.spill_bytes == 0 and res.stack_bytes == 0
        one = variants.Variant.bwd_sm90("bsa_bwd_dkdv_sm90", head_dim=d, bf16=bf16,
                                        atomic_dq=True, tma=tma)
        set_bytes = 64 * d * 4 * (1 if d == 128 else 2)
        stage_bytes = 2 * 64 * d * 2 + 64 * 2 * 4 + (8 if tma else 0)
        freed = stage_bytes if d == 128 else 0
        assert v.macro("STAGES") == (2 if d == 128 else 3)
        assert variants.smem_bytes(v) == variants.smem_bytes(one) + set_bytes - freed <= 232448
    with pytest.raises(ValueError, match="dq_buffers must be 1, or 2 with dQ by atomics"):
        variants.Variant.bwd_sm90("bsa_bwd_dkdv_sm90", head_dim=96, bf16=True, atomic_dq=True,
                                  dq_buffers=2)


def test_quantize_variant_refuses_an_unknown_kernel():
    with pytest.raises(ValueError, match="quantize.cu has quant_channel_partials"):
        variants.Variant.quantize("quant_everything", head_dim=64, bf16=True)
    v = variants.Variant.quantize("quant_rows", head_dim=96, bf16=False)
    assert v.source == variants.QUANTIZE and v.macro("D") == 96 and v.macro("BF16") == 0
