#!/usr/bin/env bash
# On the GPU machine: installs the wheel carried in .carry/wheel beside the machine's own torch
# (into a private folder on PYTHONPATH, leaving that environment untouched), then runs the Python
# tests (GPU ones included) and the host overhead benchmark. Logs under $OUT.
set -uo pipefail
root=$(pwd)
out=${OUT:-/tmp/kiln-out}
mkdir -p "$out"
py=$(command -v python3)
site=/tmp/kiln-site
rm -rf "$site"
"$py" -m pip install -q --no-deps --no-index --target "$site" "$root"/.carry/wheel/kiln-*.whl
"$py" -c "import pytest" 2>/dev/null || "$py" -m pip install -q --no-index --find-links "$root/.carry/pydeps" --target "$site" pytest
export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
(cd /tmp && "$py" -c "import kiln, torch; print(kiln.__version__, torch.__version__, torch.ops.kiln.mha_prefill)")
(cd "$root/python/tests" && timeout 500 "$py" -W ignore::UserWarning -m pytest -q -ra -p no:cacheprovider . 2>&1 | tee "$out/python-tests.log")
(cd "$root/examples/gpt_oss/tests" && timeout 400 "$py" -W ignore::UserWarning -m pytest -q -ra -s -p no:cacheprovider . 2>&1 | tee "$out/example-tests.log")
# The Transformers plug-in again with the newest Transformers from PyPI, where one was carried.
if ls "$root"/.carry/pydeps/transformers-*.whl >/dev/null 2>&1; then
  newest=/tmp/kiln-transformers-newest
  rm -rf "$newest" && "$py" -m pip install -q --no-deps --no-index --target "$newest" "$root"/.carry/pydeps/transformers-*.whl
  (cd "$root/python/tests" && PYTHONPATH="$newest:$PYTHONPATH" timeout 300 "$py" -W ignore::UserWarning -m pytest -q -ra -s \
    -p no:cacheprovider test_transformers.py 2>&1 | tee "$out/transformers-newest.log")
fi
timeout 120 "$py" "$root/bench/python_overhead.py" --json "$out/python_overhead.json" 2>&1 | tee "$out/python_overhead.txt"
