# Shared by the device scripts from the fifth session on (earlier call_*.sh stay as they ran):
# source it first. Sets $out (the run tool's $OUT), the environment, and the steps that recur.
out=${OUT:-/tmp/out}; mkdir -p "$out"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TESSERA_CACHE_DIR=/tmp/tc

# gpu_tests NAME TIMEOUT PYTEST-ARGS...: the GPU-marked tests, logged to $out/NAME.txt; prints
# the summary line and the failures.
gpu_tests() {
  local name=$1 limit=$2 start; shift 2; start=$(date +%s)
  timeout "$limit" python3 -m pytest -q -p no:cacheprovider -m gpu "$@" > "$out/$name.txt" 2>&1
  echo "$name rc=$? $(( $(date +%s) - start ))s: $(tail -1 "$out/$name.txt")"
  grep -E "^(FAILED|E ) " "$out/$name.txt" | head -10
}

# profile_table TABLE TIMEOUT BUDGET_MINUTES PROFILE-ARGS...: the regime profiler into TABLE,
# logged to $out/profile.txt; succeeds only when the whole corpus was profiled.
profile_table() {
  local table=$1 limit=$2 budget=$3 start; shift 3; start=$(date +%s)
  timeout "$limit" python3 -m tessera profile --out "$table" --budget-minutes "$budget" "$@" \
    > "$out/profile.txt" 2>&1
  echo "profile rc=$? $(( $(date +%s) - start ))s: $(tail -1 "$out/profile.txt")"
  grep -q "(done)" "$out/profile.txt"
}

# evaluate_table TABLE TIMEOUT BUDGET_MINUTES PROFILE-ARGS...: its held-out evaluation into
# $out/eval.json; prints the summary.
evaluate_table() {
  local table=$1 limit=$2 budget=$3 start; shift 3; start=$(date +%s)
  timeout "$limit" python3 -m tessera profile --evaluate "$table" --out "$out/eval.json" \
    --budget-minutes "$budget" "$@" > "$out/eval.txt" 2>&1
  echo "evaluate rc=$? $(( $(date +%s) - start ))s"; tail -3 "$out/eval.txt"
}

# request_bench TIMEOUT BENCH-ARGS...: `python3 -m tessera bench` into $out/bench.{txt,json,png};
# prints its rc, seconds and table.
request_bench() {
  local limit=$1 start; shift; start=$(date +%s)
  timeout "$limit" python3 -m tessera bench "$@" --json "$out/bench.json" --png "$out/bench.png" \
    > "$out/bench.txt" 2>"$out/bench_err.txt"
  echo "bench rc=$? $(( $(date +%s) - start ))s"; cat "$out/bench.txt"
}

# sanitize TOOL TIMEOUT K-EXPR: compute-sanitizer (memcheck, racecheck) on the GPU tests of
# tests/test_attention_gpu.py selected by K-EXPR, appended to $out/sanitizer.txt; prints the
# summary.
sanitize() {
  local tool=$1 limit=$2 expr=$3
  timeout "$limit" compute-sanitizer --tool "$tool" --error-exitcode 9 python3 -m pytest -q \
    -p no:cacheprovider -m gpu tests/test_attention_gpu.py -k "$expr" >> "$out/sanitizer.txt" 2>&1
  echo "$tool rc=$?: $(grep -E 'SUMMARY|passed|failed' "$out/sanitizer.txt" | tail -2 | tr '\n' ' ')"
}

# ab_sweep REPS FILTER DIRS... -- CASES...: kernel times of each case ("shape density regime"
# or "shape family:NAME regime") from each package dir in turn (PYTHONPATH=dir and its own
# benchmarks/sweep.py), REPS rounds alternating the dirs; lines matching FILTER (grep -E) are
# dropped before the last one is kept (e.g. "pack_keys|align" keeps the plain regime). A
# regime with options ("sm90_128x128_w12_s3[combine_threshold=0.0]") is run as it is named
# (sweep.py --regime); a bare one selects by prefix (--only).
ab_sweep() {
  local reps=$1 filter=$2 dirs=() cases t c i shape what regime pick; shift 2
  while [ "$1" != "--" ]; do dirs+=("$1"); shift; done; shift
  cases=("$@")
  for i in $(seq "$reps"); do
    for t in "${dirs[@]}"; do
      for c in "${cases[@]}"; do
        read -r shape what regime <<< "$c"
        if [[ $what == family:* ]]; then what="--family ${what#family:}"
        else what="--density $what"; fi
        if [[ $regime == *"["* ]]; then pick=--regime; else pick=--only; fi
        PYTHONPATH=$t timeout 60 python3 "$t/benchmarks/sweep.py" --shape "$shape" $what \
          "$pick" "$regime" 2>&1 | grep -Ev "$filter" | tail -1 | sed "s|^|$(basename "$t") |"
      done
    done
  done
}

# ncu_kernel NAME TIMEOUT NCU_ONE-ARGS...: ncu's per-SASS warp-state sampling, instruction mix,
# speed of light and memory sections on one bsa_fwd launch of `benchmarks/ncu_one.py ARGS`
# (call_zz55 / zz58 ran these steps inline); keeps $out/NAME.{csv.gz,details.txt,log} and
# prints the headline metrics and benchmarks/ncu_source.py's summary.
ncu_kernel() {
  local rep="$out/$1" limit=$2; shift 2
  timeout "$limit" ncu --clock-control none --section SourceCounters --section WarpStateStats \
    --section SpeedOfLight --section MemoryWorkloadAnalysis \
    --metrics sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,smsp__issue_active.avg.pct_of_peak_sustained_active \
    -k regex:bsa_fwd --launch-skip 2 --launch-count 1 -o "$rep" \
    python3 benchmarks/ncu_one.py "$@" > "$rep.log" 2>&1
  echo "== ncu $* rc=$? $(grep -m1 regime: "$rep.log")"
  ncu -i "$rep.ncu-rep" --page source --csv --print-source sass > "$rep.csv" 2> "$rep.err"
  gzip -f "$rep.csv"
  ncu -i "$rep.ncu-rep" --page details > "$rep.details.txt" 2>&1
  rm -f "$rep.ncu-rep"
  grep -E "Duration|Warp Cycles Per Issued|tensor_op|issue_active|Compute \(SM\)|L2 Hit|Mem Pipes" \
    "$rep.details.txt" | head -20
  python3 benchmarks/ncu_source.py "$rep.csv.gz" --top 16 | head -24
}

# request_kernels NAME SHAPE [TREE]: one request's kernels (planner, attention) after warm-ups,
# timed by ncu without cache flush or clock control (benchmarks/request_kernels.py), from TREE
# (a package dir, default this one) into $out/NAME.csv; prints their durations (ns). The
# seventeenth session's call_zz65-zz69 ran these steps inline.
request_kernels() {
  local name=$1 shape=$2 tree=${3:-$PWD}
  PYTHONPATH=$tree TESSERA_CACHE_DIR=/tmp/tc_$(basename "$tree") timeout 120 ncu \
    --cache-control none --clock-control none --metrics gpu__time_duration.sum --csv \
    python3 "$tree/benchmarks/request_kernels.py" --shape "$shape" --warm 3 \
    > "$out/$name.csv" 2>/dev/null
  python3 benchmarks/ncu_durations.py "$out/$name.csv" --label "$name $shape"
}

# request_ab ROUNDS REV SHAPES...: request times (benchmarks/request_hotspots.py: kernel, request
# alone, back to back, host) of the tree at git revision REV against this one, both as copies
# under .ab/ (a symlinked tree shares this one's compile cache state), processes alternating,
# logs in $out/ab_{old,new}_SHAPE_ROUND.txt; prints each process's summary line.
request_ab() {
  local rounds=$1 rev=$2 round t s log; shift 2
  mkdir -p .ab/old .ab/new
  git archive "$rev" tessera benchmarks tables | tar -x -C .ab/old
  git ls-files -z tessera benchmarks tables | xargs -0 tar -c | tar -x -C .ab/new
  for round in $(seq "$rounds"); do
    for t in .ab/old .ab/new; do
      for s in "$@"; do
        log="$out/ab_$(basename $t)_${s}_$round.txt"
        PYTHONPATH=$t TESSERA_CACHE_DIR=/tmp/tc_$(basename $t) timeout 120 python3 \
          $t/benchmarks/request_hotspots.py --shape "$s" --what request --n 50 --top 1 \
          > "$log" 2>&1
        echo "$(basename $t) rc=$? $(tail -1 "$log")"
      done
    done
  done
  rm -rf .ab
}
