"""CPU tests of ``python -m tessera quant-error`` (tessera.tools.quant_error)."""

from __future__ import annotations

import numpy as np
import pytest

from tessera import quantization as qz
from tessera.tools import quant_error as qe
from tessera.tools.cli import main as cli_main


@pytest.mark.parametrize("scheme", [qz.Scheme(), qz.Scheme(qk="e4m3", pv="16bit", rotate=False,
                                                           smooth_k=False),
                                    qz.Scheme(p_per_chunk=False, chunk_keys=64),
                                    qz.Scheme(pv="16bit", k_group=16)])
def test_scheme_names_round_trip(scheme):
    assert qe.scheme_from_name(scheme.name) == scheme


@pytest.mark.parametrize("name,match", [("int8", "reads qk_"), ("qk_int8-pv_int8-fast", "flags"),
                                        ("qk_fp4-pv_int8", "qk must be one of"),
                                        ("qk_int8-pv_int8-kg16-kg64", "one kg flag")])
def test_bad_scheme_names(name, match):
    with pytest.raises(ValueError, match=match):
        qe.scheme_from_name(name)


def test_inputs_and_row_errors():
    q, k, v = qe.inputs("outliers", 2, 300, 64)
    assert q.shape == k.shape == v.shape == (1, 2, 300, 64)
    assert abs(k[..., 4:8].mean() - 4.0) < 0.2 and abs(k[..., 8:].mean()) < 0.05
    assert (q.astype(np.float32).view(np.uint32) & 0xFFFF == 0).all()  # bf16 values
    with pytest.raises(ValueError, match="kind must be one of"):
        qe.inputs("spiky", 1, 10, 64)
    ref = np.array([[1.0, 0.0], [0.0, 0.0], [0.0, 2.0]])
    got = np.array([[1.0, 0.1], [5.0, 5.0], [0.0, 2.0]])  # the zero row is not counted
    whole, worst = qe.row_errors(got, ref)
    assert whole == pytest.approx(0.1 / np.sqrt(5)) and worst == pytest.approx(0.1)


def test_measure_a_shape_and_the_command(capsys):
    rows = qe.measure(["cogvideox-5b"], [qz.Scheme(), qz.Scheme(qk="e4m3", pv="e4m3")],
                      heads=1, rows=1)
    assert [(r.kind, r.scheme) for r in rows] == [
        (k, s) for k in qe.INPUT_KINDS
        for s in ("qk_int8-pv_int8-smooth-rotate", "qk_e4m3-pv_e4m3-smooth-rotate")]
    assert all(0 < r.error <= r.worst_row < 1 for r in rows)
    assert cli_main(["quant-error", "--shapes", "cogvideox-5b", "--heads", "1", "--rows", "1",
                     "--schemes", "qk_int8-pv_16bit-smooth-rotate"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 3 and "qk_int8-pv_16bit-smooth-rotate" in out[1]


@pytest.mark.parametrize("argv", [["--shapes", "sora"], ["--schemes", "qk_int8"],
                                  ["--heads", "0"]])
def test_the_command_refuses_bad_arguments(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        cli_main(["quant-error", *argv])
    assert exc.value.code == 2
