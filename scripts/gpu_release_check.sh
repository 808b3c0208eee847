#!/usr/bin/env bash
# On the GPU machine, as a user meets the package: `pip install --no-build-isolation .`, the full test suite and
# the layer benchmark run from outside the checkout against the installed package, then the just-in-time build
# from a checkout with no prebuilt extension. Logs under $OUT.
set -uo pipefail
out=${OUT:-/tmp/tcf_out}
repo=$PWD
mkdir -p "$out"
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site
rm -rf build torch_cudnn_fusion/_C*.so
MAX_JOBS=8 python3 -m pip install -q --no-build-isolation --no-deps --no-index . > "$out/pip.log" 2>&1
echo "pip install exit code: $?"
cd /tmp
python3 -c "import torch, torch_cudnn_fusion as t; from torch_cudnn_fusion import _extension as e; m = e.require(); print('installed:', t.__file__, '| GPU', torch.cuda.get_device_name(), '| torch', torch.__version__, '| cuDNN', m.cudnn_version(), '| frontend', m.frontend_version())"
timeout "${TEST_TIMEOUT:-300}" python3 -m pytest -q -p no:cacheprovider "$repo/tests" > "$out/pytest.log" 2>&1
echo "pytest exit code: $?"
grep -E "^(FAILED|ERROR)" "$out/pytest.log" | cut -c1-300 | head -20
tail -1 "$out/pytest.log"
if [ "${SKIP_BENCH:-0}" != 1 ]; then
  timeout "${BENCH_TIMEOUT:-400}" python3 "$repo/benchmarks/bench_conv_layers.py" --json "$out/conv_layers.json" > "$out/bench.log" 2>&1
  echo "benchmark exit code: $?"
  python3 "$repo/benchmarks/profile_overhead.py" --cin 64 --cout 128 --size 56 > "$out/profile.log" 2>&1
fi
python3 -m pip uninstall -q -y torch_cudnn_fusion
cd "$repo"
export PYTHONPATH=/tmp/site:$repo TORCH_EXTENSIONS_DIR=/tmp/jit_cache
python3 - <<'PY' > "$out/jit.log" 2>&1
import time, torch, torch_cudnn_fusion as tcf
start = time.time()
print("available:", tcf.is_available(), tcf.unavailable_reason(), f"(first load {time.time() - start:.0f} s)")
layer = tcf.Conv2dReLU(16, 16, 3, padding=1).cuda().to(memory_format=torch.channels_last)
x = torch.randn(2, 16, 8, 8, device="cuda").to(memory_format=torch.channels_last)
y = layer(x)
torch.testing.assert_close(y, torch.relu(torch.nn.functional.conv2d(x, layer.weight, layer.bias, padding=1)))
print("jit-built layer:", layer.fusion_status)
start = time.time()
import subprocess, sys
second = subprocess.run([sys.executable, "-c", "import torch_cudnn_fusion as t; print(t.is_available())"],
                        capture_output=True, text=True)
print(f"second process: {second.stdout.strip()} {second.stderr.strip()[-200:]} in {time.time() - start:.1f} s")
PY
echo "jit check exit code: $?"
cat "$out/jit.log" | tail -5
[ -f "$out/bench.log" ] && sed -n '/^NVIDIA/,$p' "$out/bench.log"
grep -E "backward op|fwd\+bwd" "$out/profile.log" 2>/dev/null
