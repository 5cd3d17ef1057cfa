# The two commands of the README, and the checks CI runs.
#   make run    set up (first time) and run the local stack in the foreground (Ctrl-C stops it)
#   make test   set up (first time) and run every test on real Kafka and Consul
SHELL := /bin/bash
VENV := .venv/bin
export PATH := $(CURDIR)/.venv/bin:$(CURDIR)/node_modules/.bin:$(PATH)

.PHONY: setup setup-quick run up down test test-unit check lint typecheck protos bench-short

setup:
	scripts/setup.sh

setup-quick:
	scripts/setup.sh --quick

run: setup-quick
	$(VENV)/dsctl dev up

up: setup-quick
	$(VENV)/dsctl dev up --detach

down:
	$(VENV)/dsctl dev down

test: setup
	$(VENV)/python -m pytest

test-unit:
	$(VENV)/python -m pytest tests/unit

check: lint typecheck protos

lint:
	$(VENV)/ruff check .
	$(VENV)/ruff format --check .

typecheck:
	$(VENV)/mypy services spark

protos:
	bash protos/check.sh

bench-short:
	$(VENV)/python tests/bench/bench_balancer.py --short
	$(VENV)/python tests/bench/bench_session.py --short
	$(VENV)/python tests/bench/bench_sidecar.py --short
	$(VENV)/python tests/bench/bench_spark.py --short
