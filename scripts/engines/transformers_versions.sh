#!/usr/bin/env bash
# Run the transformers engine test (tests/engines) against other transformers versions: each version is installed
# with pip into its own folder (no dependencies: the rest comes from the current environment) and put first on
# PYTHONPATH, so it shadows the installed one. Prints, per version, each output's max |logit diff| and the result.
#   bash scripts/engines/transformers_versions.sh [VERSION ...]      (default: 5.20.2 5.24.0)
# Env: PYTHON (default python3), CACHE (default ${TMPDIR:-/tmp}/fimoe-transformers), PYTEST_ARGS (e.g. "-k demo").
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-python3}
CACHE=${CACHE:-${TMPDIR:-/tmp}/fimoe-transformers}
status=0
for v in "${@:-5.20.2 5.24.0}"; do
  for version in $v; do
    dir="$CACHE/$version"
    if [ ! -f "$dir/transformers/__init__.py" ]; then
      "$PY" -m pip install --quiet --no-deps --target "$dir" "transformers==$version"
    fi
    got=$(PYTHONPATH="$dir:$PWD" "$PY" -c "import transformers; print(transformers.__version__)")
    if [ "$got" != "$version" ]; then
      echo "transformers $version: imported $got instead; remove $dir and run again" >&2
      exit 1
    fi
    echo "== transformers $version"
    log="$CACHE/$version.log"
    rc=0
    PYTHONPATH="$dir:$PWD" "$PY" -m pytest -q tests/engines -s -p no:warnings ${PYTEST_ARGS:-} >"$log" 2>&1 || rc=$?
    grep -E "max \|logit diff\||passed|failed|skipped|Error" "$log" || true
    if [ "$rc" != 0 ]; then echo "transformers $version: pytest exit $rc (log: $log)"; status=1; fi
  done
done
exit $status
