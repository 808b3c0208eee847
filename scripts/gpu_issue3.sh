#!/usr/bin/env bash
# One device call for the BatchNorm work: build, BN + fuse tests, the MobileNet benchmark, the training example.
set -uo pipefail
out=${OUT:-/tmp/tcf_out}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
bash scripts/gpu_build.sh > "$out/build.log" 2>&1 || { echo "build failed"; grep -E "error" "$out/build.log" | head -20; tail -5 "$out/build.log"; exit 1; }
export PYTHONPATH=/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}
python3 -c "import torch, torch_cudnn_fusion as t; from torch_cudnn_fusion import _extension as e; m=e.require(); print('GPU', torch.cuda.get_device_name(), '| torch', torch.__version__, '| cuDNN', m.cudnn_version(), '| frontend', m.frontend_version())"
if [ "${SKIP_TESTS:-0}" != 1 ]; then
  timeout "${TEST_TIMEOUT:-300}" python3 -m pytest -q -p no:cacheprovider ${TESTS:-tests} > "$out/pytest.log" 2>&1
  echo "pytest exit code: $?"
  grep -E "^(FAILED|ERROR)" "$out/pytest.log" | cut -c1-400 | head -30
  tail -2 "$out/pytest.log"
fi
if [ "${SKIP_EXAMPLE:-0}" != 1 ]; then
  timeout "${EXAMPLE_TIMEOUT:-200}" python3 examples/train_mobilenet_v1.py --compare-eager ${EXAMPLE_ARGS:-} --out "$out/example" > "$out/example.log" 2>&1
  echo "example exit code: $?"
  tail -6 "$out/example.log" | tr '\r' '\n' | tail -6
fi
if [ "${DATA_EXAMPLE:-0}" = 1 ]; then  # the --data path on an image folder written from the synthetic classes
  python3 examples/synthetic_shapes.py /tmp/tcf_shapes --per-class "${DATA_PER_CLASS:-300}" > "$out/example_data.log" 2>&1
  timeout "${EXAMPLE_TIMEOUT:-200}" python3 examples/train_mobilenet_v1.py --data /tmp/tcf_shapes --compare-eager \
    ${DATA_ARGS:-} --out "$out/example_data" >> "$out/example_data.log" 2>&1
  echo "data example exit code: $?"
  tail -7 "$out/example_data.log" | tr '\r' '\n' | tail -7
fi
if [ "${SKIP_BENCH:-0}" != 1 ]; then
  timeout "${BENCH_TIMEOUT:-300}" python3 benchmarks/bench_mobilenet.py --json "$out/mobilenet.json" ${BENCH_ARGS:-} > "$out/bench.log" 2>&1
  echo "benchmark exit code: $?"
  grep -A60 "^layer (training" "$out/bench.log" | head -60
fi
