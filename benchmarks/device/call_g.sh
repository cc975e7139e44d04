#!/usr/bin/env bash
# Device call: first run of the Hopper (sm90, wgmma) family — SASS check, GPU tests, regime
# sweep (both families), bench against the baselines.
set -uo pipefail
out=${OUT:-/tmp/out}; mkdir -p "$out"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TESSERA_CACHE_DIR=/tmp/tc
python3 - > "$out/sass_check.txt" 2>&1 <<'PY'
from tessera.cuda import loader
v = loader.Variant.bsa_sm90(block_m=128, block_n=128, head_dim=128, stages=3, bf16=True)
r = loader.compile_variant(v, "sm_90a", use_cache=False)
open("/tmp/sm90.cubin", "wb").write(r.cubin)
print(r.registers, "registers")
PY
(nvdisasm /tmp/sm90.cubin || cuobjdump -sass /tmp/sm90.cubin) > "$out/sm90.sass" 2>&1
echo "sass: $(cat $out/sass_check.txt | tail -1); GMMA $(grep -c GMMA $out/sm90.sass) HMMA $(grep -c ' HMMA' $out/sm90.sass) LDL/STL $(grep -cE 'LDL|STL' $out/sm90.sass)"
s=$(date +%s)
timeout 240 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_attention_gpu.py --maxfail=25 > "$out/gpu_tests.txt" 2>&1
echo "gpu tests rc=$? $(( $(date +%s)-s ))s: $(tail -1 $out/gpu_tests.txt)"; grep -E "^FAILED" "$out/gpu_tests.txt" | head -30
for a in "--density 0.1" "--density 1.0" "--shape cogvideox-5b --density 0.1"; do
  timeout 60 python3 benchmarks/sweep.py $a 2>&1 | tee -a "$out/sweep.txt" | head -8
done
timeout 150 python3 -m tessera bench --shape wan-1.3b-480p,cogvideox-5b --case random-10,dense --family topk_pooled \
  --reps 10 --json "$out/bench.json" > "$out/bench.txt" 2> "$out/bench_err.txt"; echo "bench rc=$?"; cat "$out/bench.txt"; tail -3 "$out/bench_err.txt"
