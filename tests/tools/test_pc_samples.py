"""tessera.tools.pc_samples: ncu source-page exports read into roles and instruction classes."""

from __future__ import annotations

import io

import pytest

from tessera.tools import pc_samples as P

HEADER = '"Address","Source","group:smsp__pcsamp_warp_stall_reasons","smsp__pcsamp_sample_count"'


def export(*kernels: tuple[str, list[tuple[str, int]]]) -> str:
    """An ncu source-page CSV of these kernels' (SASS line, samples) rows."""
    out = []
    for name, rows in kernels:
        out += [f'"Kernel Name","{name}",', HEADER]
        out += [f'"0x{i:04x}","      {src}","{n:,}","{n:,}"' for i, (src, n) in enumerate(rows)]
    return "\n".join(out) + "\n"


# A warp-specialized kernel: the consumers claim registers first, the producer releases them.
SPECIALIZED = [
    ("USETMAXREG.TRY_ALLOC.CTAPOOL UP0, 0x88", 0),
    ("SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [UR12+0x10000], R7", 10),
    ("@!P0  BRA 0x7f00", 30),  # the wait's poll loop
    ("HGMMA.64x64x16.F32.BF16 R24, gdesc[UR12], RZ, !UPT", 40),
    ("WARPGROUP.DEPBAR.LE gsb0, 0x1", 50),
    ("FMNMX R7, R28, R29, !PT", 60),
    ("SHFL.BFLY PT, R8, R7, 0x1, 0x1f", 20),
    ("MUFU.EX2 R29, R29", 100),
    ("FFMA R24, R24, UR8, R11", 30),
    ("@P0   BRA 0x7f10", 60),  # a branch after no wait: the rest
    ("IMAD.U32 R4, RZ, RZ, UR8", 100),
    ("USETMAXREG.DEALLOC.CTAPOOL 0x18", 0),
    ("SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [UR9+0x10018], R2", 1000),
    ("@!P0  BRA 0x7f20", 500),
]


def test_roles_and_classes_of_a_warp_specialized_kernel():
    """Samples between the register release and the end are the producer's; the consumers'
    are split by class, a branch right after a barrier wait counting with the wait."""
    (k,) = P.read_source_csv(io.StringIO(export(("bsa_fwd_sm90", SPECIALIZED))))
    assert k.name == "bsa_fwd_sm90" and k.total == 2000 and len(k.sources) == len(SPECIALIZED)
    producer, classes = k.shares()
    assert producer == pytest.approx(1500 / 2000)
    consumers = 500
    assert classes == pytest.approx({
        "exponentials": 100 / consumers, "row maxima": 80 / consumers,
        "arithmetic": 30 / consumers, "wgmma issue": 40 / consumers,
        "wgmma waits": 50 / consumers, "barrier waits": 40 / consumers,
        "rest": 160 / consumers})
    assert sum(classes.values()) == pytest.approx(1.0)
    assert [i for i, _, _ in k.top(2)] == [12, 13]
    assert k.role_and_class(13) == ("producer", "barrier waits")  # the poll loop's branch
    assert k.role_and_class(9) == ("consumers", "rest")
    assert k.role_and_class(0) == ("consumers", "rest")


def test_a_kernel_without_register_moves_is_all_consumers_and_kernels_are_apart():
    """A producer-less kernel (cuDNN's blk64 shape) has no producer share; two kernels in one
    export are read apart, and a claim after a release ends the producer's code (FA4's order:
    producer first)."""
    plain = [("NANOSLEEP.SYNCS 0x989680", 5), ("@!P0  BRA 0x10", 5), ("MUFU.EX2 R1, R1", 10)]
    fa4_like = [("USETMAXREG.DEALLOC.CTAPOOL 0x18", 0), ("UTMALDG.4D [UR8], [UR28]", 7),
                ("USETMAXREG.TRY_ALLOC.CTAPOOL UP0, 0xf0", 0), ("MUFU.EX2 R2, R2", 3)]
    a, b = P.read_source_csv(io.StringIO(export(("plain", plain), ("fa4", fa4_like))))
    assert a.shares() == (0.0, pytest.approx({**{n: 0.0 for n, _ in P.CLASSES}, "rest": 0.0,
                                              "barrier waits": 0.5, "exponentials": 0.5}))
    assert b.producer_lines() == [True, True, False, False]
    assert b.shares()[0] == pytest.approx(0.7)


def test_opcode_and_class_of_predicated_lines():
    assert P.opcode("@!UP0  BRA 0x7f") == "BRA" and P.opcode("  @PT FADD R1, R2, R3") == "FADD"
    assert P.instruction_class("@!P0 BRA 0x1", "SYNCS.PHASECHK.TRANS64 P0, [R3], R2") == \
        "barrier waits"
    assert P.instruction_class("@!P0 BRA 0x1", "FADD R1, R2, R3") == "rest"
    assert P.instruction_class("MUFU.RCP R1, R1") == "rest"  # only exponentials are classed


def test_an_export_without_sample_columns_is_refused_and_main_reports(tmp_path, capsys):
    bad = '"Kernel Name","k",\n"Address","Source","inst_executed"\n"0x0","FADD R1, R2, R3","4"\n'
    with pytest.raises(ValueError, match="no PC-sample column"):
        P.read_source_csv(io.StringIO(bad))
    path = tmp_path / "src.csv"
    path.write_text(export(("bsa_fwd_sm90", SPECIALIZED)))
    assert P.main([str(path), "--top", "1"]) == 0
    out = capsys.readouterr().out
    assert "2,000 samples, producer 75.0%" in out and "exponentials 20.0%" in out
    assert out.count("line ") == 1 and "producer  barrier waits" in out
    empty = tmp_path / "empty.csv"
    empty.write_text("")
    assert P.main([str(empty)]) == 1
    with pytest.raises(SystemExit):
        P.main([str(path), "--top", "-1"])


def test_executed_instructions_are_the_consumers_mix_by_opcode(tmp_path, capsys):
    """A SourceCounters export is read by its executed-instructions column; the consumers'
    lines sum by base opcode (the producer's are left out), and main divides by --per."""
    head = '"Address","Source","Warp Instructions Executed"'
    rows = [("USETMAXREG.TRY_ALLOC.CTAPOOL UP0, 0x88", 4), ("HGMMA.64x128x16.F32.BF16 R24", 64),
            ("@P0 HGMMA.64x128x16.F32.BF16 R88", 64), ("MUFU.EX2 R29, R29", 512),
            ("FFMA.FTZ R1, R2, R3, R4", 1_024), ("USETMAXREG.DEALLOC.CTAPOOL 0x18", 1),
            ("UTMALDG.4D [UR8], [UR28]", 32)]
    text = '"Kernel Name","k",\n' + head + "\n" + "\n".join(
        f'"0x{i:04x}","{src}","{n:,}"' for i, (src, n) in enumerate(rows)) + "\n"
    with pytest.raises(ValueError, match="no PC-sample column"):
        P.read_source_csv(io.StringIO(text))
    (k,) = P.read_source_csv(io.StringIO(text), P.EXECUTED)
    assert k.consumer_opcodes() == {"FFMA": 1_024, "MUFU": 512, "HGMMA": 128, "USETMAXREG": 4}
    assert list(k.consumer_opcodes()) == ["FFMA", "MUFU", "HGMMA", "USETMAXREG"]
    path = tmp_path / "sc.csv"
    path.write_text(text)
    assert P.main([str(path), "--executed", "--per", "64", "--top", "2"]) == 0
    out = capsys.readouterr().out
    assert "consumers 26.1 warp instructions per 64, producer 0.5" in out
    assert "FFMA 16.0, MUFU 8.0" in out and "HGMMA" not in out
    with pytest.raises(SystemExit):
        P.main([str(path), "--executed", "--per", "0"])
    samples = tmp_path / "samples.csv"
    samples.write_text(export(("bsa_fwd_sm90", SPECIALIZED)))
    with pytest.raises(ValueError, match="none of the columns"):
        P.main([str(samples), "--executed"])


def test_a_source_counters_export_is_read_by_its_sample_column_too():
    """The SourceCounters section names its PC samples in words; they are read by default."""
    text = ('"Kernel Name","k",\n"Address","Source","Warp Stall Sampling (All Samples)",'
            '"Instructions Executed"\n"0x0","MUFU.EX2 R1, R1","7","64"\n'
            '"0x1","FADD R1, R2, R3","3","64"\n')
    (k,) = P.read_source_csv(io.StringIO(text))
    assert k.samples == [7, 3] and k.shares()[1]["exponentials"] == pytest.approx(0.7)
    (e,) = P.read_source_csv(io.StringIO(text), P.EXECUTED)
    assert e.consumer_opcodes() == {"MUFU": 64, "FADD": 64}


def test_one_stall_reasons_samples_rank_the_lines(tmp_path, capsys):
    """--column reads the one column whose name contains it: the lines where warps wait for
    that reason; an ambiguous or missing name is refused with the columns listed."""
    head = ('"Address","Source","smsp__pcsamp_sample_count",'
            '"smsp__pcsamp_warps_issue_stalled_long_scoreboard",'
            '"smsp__pcsamp_warps_issue_stalled_barrier"')
    rows = [("DEPBAR.LE SB0, 0x0", 90, 80, 0), ("BAR.SYNC.DEFER_BLOCKING 0x1, 0x100", 50, 0, 45),
            ("LDG.E.CONSTANT R17, desc[UR50][R8.64]", 30, 25, 0), ("MUFU.EX2 R1, R1", 30, 0, 0)]
    text = '"Kernel Name","k",\n' + head + "\n" + "\n".join(
        f'"0x{i:04x}","{src}","{a}","{b}","{c}"' for i, (src, a, b, c) in enumerate(rows)) + "\n"
    (k,) = P.read_source_csv(io.StringIO(text), containing="long_scoreboard")
    assert k.samples == [80, 0, 25, 0] and k.top(1)[0][2].startswith("DEPBAR")
    for bad in ("stalled", "lg_throttle"):
        with pytest.raises(ValueError, match="columns' names contain"):
            P.read_source_csv(io.StringIO(text), containing=bad)
    path = tmp_path / "src.csv"
    path.write_text(text)
    assert P.main([str(path), "--column", "barrier", "--top", "1"]) == 0
    out = capsys.readouterr().out
    assert "k: 45 samples" in out and out.count("line ") == 1 and "BAR.SYNC" in out
    with pytest.raises(SystemExit):
        P.main([str(path), "--column", "barrier", "--executed"])
