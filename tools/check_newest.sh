#!/usr/bin/env bash
# The newest-versions check: a new virtual environment with no lock (whatever the package index serves today
# within setup.cfg's ranges), then lint and the whole test suite in a random order. It prints every package whose
# version differs from requirements.txt, and the result. Record the run in docs/dependencies.md.
#   bash tools/check_newest.sh             # the whole suite
#   bash tools/check_newest.sh tests/eval  # arguments go to pytest
set -uo pipefail
cd "$(dirname "$0")/.."

export CI="${CI:-true}"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1
export PACS_SHARED="${PACS_SHARED:-$(cd .. && pwd)/shared}"
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1

PYTHON="${PYTHON:-python3.11}"
command -v "$PYTHON" >/dev/null 2>&1 || PYTHON=python3
VENV=.venv-newest
rm -rf "$VENV"
"$PYTHON" -m venv "$VENV"
# shellcheck disable=SC1091
. "$VENV/bin/activate"
set -e
python -m pip install -q --upgrade pip 2>&1 | { grep -v "^WARNING: Location" || true; }
python -m pip install -q --upgrade --upgrade-strategy eager -e ".[dev]" 2>&1 | { grep -v "^WARNING: Location" || true; }
set +e

echo "== versions that differ from requirements.txt (lock -> newest)"
python - <<'PY'
import re
from importlib.metadata import distributions
from pathlib import Path

canon = lambda name: re.sub(r"[-_.]+", "-", name).lower()
locked = {}
for line in Path("requirements.txt").read_text().splitlines():
    match = re.match(r"^([A-Za-z0-9_.\-]+)==([^\s;#]+)", line)
    if match:
        locked[canon(match[1])] = match[2]
installed = {canon(d.metadata["Name"]): d.version for d in distributions()}
rows = [(name, locked.get(name, "-"), installed.get(name, "-")) for name in sorted(set(locked) | set(installed))
        if name not in {"pacs-captioning", "pip"} and locked.get(name) != installed.get(name)]
for name, old, new in rows:
    print(f"  {name}: {old} -> {new}")
print(f"  ({len(rows)} differ)" if rows else "  none")
PY

status=0
ruff check . || status=1
bash tools/lint_imports.sh || status=1
SEED="${PACS_TEST_SEED:-$(python -c 'import random; print(random.randrange(2**31))')}"
# as .ci/run: one worker process per core, at most 4, a test file's tests together (PACS_TEST_WORKERS=1: serial)
WORKERS="${PACS_TEST_WORKERS:-$(python -c 'import os; print(max(1, min(4, len(os.sched_getaffinity(0)))))')}"
echo "test order: --randomly-seed=$SEED, $WORKERS worker(s)"
if [ "$WORKERS" -gt 1 ]; then
  python -m pytest -q -p randomly --randomly-seed="$SEED" -n "$WORKERS" --dist loadfile "$@" || status=1
else
  python -m pytest -q -p randomly --randomly-seed="$SEED" "$@" || status=1
fi
echo "== newest-versions check on $(date -u +%Y-%m-%d): $([ $status = 0 ] && echo PASSED || echo FAILED)"
exit $status
