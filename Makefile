# gpucap developer commands. `make run` serves the demo; `make test` runs every check CI runs.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PORT ?= 8000

.PHONY: run test bench lint format install install-dev db migrate demo browser libvirt-dev realguest wrk clean

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --upgrade pip

$(VENV)/.installed: requirements.txt | libvirt-dev $(VENV)/bin/python
	$(VENV)/bin/pip install --quiet -r requirements.txt
	touch $@

$(VENV)/.installed-dev: requirements.txt requirements-dev.txt | libvirt-dev $(VENV)/bin/python
	$(VENV)/bin/pip install --quiet -r requirements-dev.txt
	touch $(VENV)/.installed $@

install: $(VENV)/.installed
install-dev: $(VENV)/.installed-dev

db: install
	$(PY) manage.py createdb
	$(PY) manage.py migrate --no-input

demo: db
	$(PY) manage.py demo --url http://127.0.0.1:$(PORT)/

# Web (uvicorn), Celery worker and beat together under honcho.
run: demo
	mkdir -p var
	SIMULATOR_ENABLED=$${SIMULATOR_ENABLED:-1} SIMULATOR_BASE_URL=$${SIMULATOR_BASE_URL:-http://127.0.0.1:$(PORT)} \
		$(VENV)/bin/honcho start --port $(PORT)

lint: install-dev
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/lint-imports

format: install-dev
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

# Debian's libvirt headers, pkg-config and a C compiler: pip builds libvirt-python against them
# (the libvirt driver, and its tests on libvirt's built-in test hypervisor). Checked before
# every install, so a fresh machine gets them before pip needs them.
libvirt-dev:
	@pkg-config --exists libvirt 2>/dev/null && command -v cc >/dev/null \
		|| (apt-get update -qq && apt-get install -y -qq libvirt-dev pkg-config gcc >/dev/null)

# Debian's chromium for the browser tests (Playwright drives it; it never downloads browsers).
browser:
	@command -v chromium >/dev/null || (apt-get update -qq && apt-get install -y -qq chromium >/dev/null)

# Debian's libvirtd, QEMU and nginx for the real-guest tests (tests/realguest): a node without GPUs
# on this machine, booting real guests behind the shipped metadata proxy. The tests start their
# own private libvirtd and nginx; the guest's kernel and busybox come from Debian at test time.
realguest:
	@command -v libvirtd >/dev/null && command -v qemu-system-x86_64 >/dev/null \
		&& command -v qemu-img >/dev/null && command -v nginx >/dev/null \
		|| (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
			--no-install-recommends libvirt-daemon-system qemu-system-x86 qemu-utils nginx \
			iproute2 >/dev/null)

test: install-dev browser realguest lint
	$(PY) manage.py makemigrations --check --dry-run
	$(VENV)/bin/pytest

# Debian's wrk drives the metadata endpoint benchmark's load.
wrk:
	@command -v wrk >/dev/null || (apt-get update -qq && apt-get install -y -qq wrk >/dev/null)

bench: install-dev wrk realguest
	$(PY) bench/arbiter_scale.py
	$(PY) bench/simulate.py
	$(PY) bench/metadata_load.py
	$(PY) bench/set_page.py
	$(PY) bench/notice_latency.py
	$(PY) bench/usage_export.py
	$(PY) bench/router_overhead.py
	$(PY) bench/guest_notice.py
	$(PY) bench/soak.py

clean:
	rm -rf $(VENV) var .pytest_cache .ruff_cache .hypothesis
