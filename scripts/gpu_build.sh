#!/usr/bin/env bash
# On the GPU machine: install the carried wheels (.whl/) and build the extension in place.
set -euo pipefail
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
MAX_JOBS=${MAX_JOBS:-8} python3 setup.py -q build_ext --inplace 2>&1 | grep -v "Wc++20-extensions\|^ *|\|^In file included\|^ *from " || true
test -f torch_cudnn_fusion/_C*.so
