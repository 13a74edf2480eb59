# draftboard: two commands do everything on a fresh machine.
#   make demo   - the main job on its embedded default (SQLite + private Redis + CPU vLLM server)
#   make test   - every test (SQLite leg, then PostgreSQL + system Redis leg), plus ruff
SHELL := /bin/bash
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test venv stop lint system-deps

$(STAMP): requirements.txt scripts/install.sh
	bash scripts/install.sh "$(PY)" "$(VENV)"
	touch $(STAMP)

venv: $(STAMP)

system-deps:
	bash scripts/system_deps.sh

demo: $(STAMP)
	$(BIN)/python manage.py demo

stop: $(STAMP)
	$(BIN)/python manage.py stop_services

lint: $(STAMP)
	$(BIN)/ruff check .

test: $(STAMP) system-deps
	bash scripts/test.sh
