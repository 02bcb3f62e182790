#!/usr/bin/env bash
# Installs the real T5X (not on the package index) next to this project's pinned stack.
#
# From ../shared/wheels when that folder holds the wheels (machines without GitHub access; the
# wheels are built from the commits pinned in requirements-t5x.txt), else from GitHub. T5X,
# airio and jestimator go in with --no-deps (their metadata names unpinned GitHub heads of flax,
# optax, seqio and clu); their other runtime dependencies come from the `t5x` extra.
#
#   bash scripts/install_t5x.sh            # then: python -m t5x.train --gin_file=gin/...
set -euo pipefail
# `python` and `pip` are those of the README's test command: the active environment's.
cd "$(dirname "$0")/.."
wheels="${T5X_WHEELS:-../shared/wheels}"
pip_install() { python -m pip install -q --disable-pip-version-check "$@"; }
if ls "$wheels"/t5x-*.whl "$wheels"/airio-*.whl "$wheels"/jestimator-*.whl >/dev/null 2>&1; then
  echo "installing T5X from $wheels"
  pip_install --no-deps "$wheels"/t5x-*.whl "$wheels"/airio-*.whl "$wheels"/jestimator-*.whl
else
  echo "installing T5X from GitHub (requirements-t5x.txt)"
  pip_install --no-deps -r requirements-t5x.txt
fi
# The `t5x` extra. Where this checkout is already installed in editable mode (the README's
# `pip install -e ".[test]"`), its packages are installed by name: building and installing the
# project again (an editable build, about 20 s on 2 cores) would change nothing.
if python -I -c '
import importlib.util, pathlib, sys
spec = importlib.util.find_spec("mcwq_t5x")  # -I: not from the current folder, from the install
here = pathlib.Path.cwd().resolve()
sys.exit(0 if spec and pathlib.Path(spec.origin).resolve().parents[1] == here else 1)'; then
  pip_install -r requirements-t5x-runtime.txt
else
  pip_install -e ".[t5x]"
fi
python -c "import t5x.train, t5x.models, t5x.partitioning; print('t5x ok')"
