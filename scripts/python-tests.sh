#!/usr/bin/env bash
# The Python package's tests: builds the wheel (scikit-build-core, from PyPI), checks it with
# auditwheel, installs it into a fresh virtual environment beside torch and pytest from PyPI, and
# runs python/tests and examples/gpt_oss/tests there (GPU tests skip without a GPU). KILN_PY_VENV names the environment
# (default build/python-venv; recreated unless KILN_PY_REUSE_VENV=1).
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${KILN_PY_VENV:-build/python-venv}
wheel_dir=build/wheel
if [ "${KILN_PY_REUSE_VENV:-0}" != 1 ] || [ ! -x "$venv/bin/python" ]; then
  python3 -m venv --clear "$venv"
  "$venv/bin/pip" install -q --upgrade pip
  "$venv/bin/pip" install -q torch numpy pytest auditwheel scikit-build-core transformers
fi
venv=$(cd "$venv" && pwd)  # the steps below change directory
rm -rf "$wheel_dir"
"$venv/bin/pip" wheel -q --no-deps --no-build-isolation -w "$wheel_dir" .
wheel=$(ls "$wheel_dir"/kiln-*.whl)
"$venv/bin/auditwheel" show "$wheel" | tee "$wheel_dir/auditwheel.txt"
grep -q 'consistent with the following platform tag: *"manylinux_' <(tr '\n' ' ' < "$wheel_dir/auditwheel.txt") \
  || { echo "python-tests: auditwheel finds $wheel not manylinux-compatible" >&2; exit 1; }
"$venv/bin/pip" install -q --no-deps --force-reinstall "$wheel"
# The issue's acceptance line, verbatim, from outside the source tree.
(cd /tmp && "$venv/bin/python" -c "import kiln, torch; print(kiln.__version__, torch.ops.kiln.mha_prefill)")
# From python/tests, so `import kiln` is the installed package, not python/kiln.
(cd python/tests && "$venv/bin/python" -W ignore::UserWarning -m pytest -q -ra -p no:cacheprovider .)
# The GPT-OSS example's tests (its CPU side here; its parity test on a GPU).
cd examples/gpt_oss/tests && "$venv/bin/python" -W ignore::UserWarning -m pytest -q -ra -p no:cacheprovider .
