export TESSERA_CACHE_DIR=/tmp/tc
python3 -m pip install -q --no-index --no-deps --target /tmp/dz .dz/*.whl > $OUT/pip.log 2>&1; echo "pip rc=$?"
export PYTHONPATH=$PWD:/tmp/dz
python3 -c "import diffusers; print('diffusers', diffusers.__version__)" 2>&1 | tail -1
timeout 200 python3 -m pytest -q -x tests/gpu/test_gpu_diffusers.py > $OUT/dtests.log 2>&1; echo "diffusers GPU tests: $(tail -1 $OUT/dtests.log)"
grep -E "^(FAILED|E  )" $OUT/dtests.log | head -12
timeout 200 python3 -m tessera pipeline --model wan-1.3b --method topk_cubes --density 0.1 --steps 3 > $OUT/wan-topk.log 2>&1; tail -6 $OUT/wan-topk.log
timeout 120 python3 -m tessera pipeline --model wan-1.3b --method sliding_tile --window 2 3 3 --steps 3 > $OUT/wan-sta.log 2>&1; tail -6 $OUT/wan-sta.log
