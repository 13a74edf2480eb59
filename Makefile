# draftboard: two commands do everything on a fresh machine.
#   make demo   - the main job on its embedded default (SQLite + private Redis + CPU vLLM server)
#   make test   - every test (SQLite leg, then PostgreSQL + system Redis leg), plus ruff
# and one per role on other machines (the role files are listed in requirements.txt):
#   make worker-venv - a GPU host's worker: Django + Celery + benchkit, no engine, no torch
#   make web-venv    - the web site on a server (gunicorn + whitenoise; README "Deploy")
SHELL := /bin/bash
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test venv worker-venv web-venv stop lint system-deps

REQS := requirements/base.txt requirements/web.txt requirements/worker.txt requirements/demo.txt requirements/dev.txt

$(STAMP): requirements.txt $(REQS) scripts/install.sh
	bash scripts/install.sh "$(PY)" "$(VENV)"
	touch $(STAMP)

venv: $(STAMP)

worker-venv: $(VENV)/.installed-worker
$(VENV)/.installed-worker: requirements/worker.txt requirements/base.txt scripts/install.sh
	bash scripts/install.sh "$(PY)" "$(VENV)" requirements/worker.txt
	touch $@

web-venv: $(VENV)/.installed-web
$(VENV)/.installed-web: requirements/web.txt requirements/base.txt scripts/install.sh
	bash scripts/install.sh "$(PY)" "$(VENV)" requirements/web.txt
	touch $@

system-deps:
	bash scripts/system_deps.sh

demo: $(STAMP)
	@bash scripts/system_deps.sh report || echo "system packages missing: the demo runs, its PDF report needs them"
	$(BIN)/python manage.py demo

stop: $(STAMP)
	$(BIN)/python manage.py stop_services

lint: $(STAMP)
	$(BIN)/ruff check .

test: $(STAMP) system-deps
	bash scripts/test.sh
