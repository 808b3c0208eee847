#!/usr/bin/env bash
# One device call for the engine-policy / plan-file work: clean build, tests, the BN layer profile, the MobileNet
# layer table, and the cold/warm plan-cache measurement. Logs under $OUT.
set -uo pipefail
out=${OUT:-/tmp/tcf_out}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
rm -rf build torch_cudnn_fusion/_C*.so
bash scripts/gpu_build.sh > "$out/build.log" 2>&1 || { echo "build failed"; grep -E "error" "$out/build.log" | head -20; tail -5 "$out/build.log"; exit 1; }
export PYTHONPATH=/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}
python3 -c "import torch, torch_cudnn_fusion as t; from torch_cudnn_fusion import _extension as e; m=e.require(); print('GPU', torch.cuda.get_device_name(), '| torch', torch.__version__, '| cuDNN', m.cudnn_version(), '| frontend', m.frontend_version())"
if [ "${SKIP_TESTS:-0}" != 1 ]; then
  timeout "${TEST_TIMEOUT:-300}" python3 -m pytest -q -p no:cacheprovider -rA ${TESTS:-tests} > "$out/pytest.log" 2>&1
  echo "pytest exit code: $?"
  grep -E "^(FAILED|ERROR)" "$out/pytest.log" | cut -c1-600 | head -30
  grep -E "^plan file:" "$out/pytest.log" | head -3
  tail -1 "$out/pytest.log"
fi
if [ "${SKIP_PROFILE:-0}" != 1 ]; then
  (cd benchmarks && timeout 200 python3 profile_bn_layer.py > "$out/profile_bn.log" 2>&1; echo "profile exit code: $?"; tail -7 "$out/profile_bn.log")
fi
if [ "${SKIP_LAYERS:-0}" != 1 ]; then
  timeout 250 python3 benchmarks/bench_mobilenet.py --layers-only --json "$out/mobilenet_layers.json" > "$out/layers.log" 2>&1
  echo "layers exit code: $?"; grep -A21 "^layer (training" "$out/layers.log"
fi
if [ "${SKIP_COLD:-0}" != 1 ]; then
  timeout 300 python3 benchmarks/bench_plan_cache.py --json "$out/plan_cache.json" > "$out/plan_cache.log" 2>&1
  echo "plan cache exit code: $?"; tail -7 "$out/plan_cache.log"
fi
if [ "${SKIP_DEMO:-0}" != 1 ]; then
  timeout 120 python3 examples/engine_policies.py > "$out/engine_policies.log" 2>&1
  echo "policy example exit code: $?"; cat "$out/engine_policies.log" | cut -c1-260
fi
