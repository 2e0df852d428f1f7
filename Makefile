# make demo: set up .venv and run the main job (a comparison); make test: set up and run the tests;
# make check: the inner loop (the tests that start no process); make lock: constraints.txt from .venv.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test check setup lock browser clean docs docs-serve

# pip, then torch alone, then fedrift with every extra but bench, all under constraints.txt:
# the version of every distribution the set-up installs, pip and setuptools included, as
# `make lock` wrote them (issue 68, F15), so that a set-up a month from now installs what the
# tests passed with, not the newest of each. One left out: certifi, a bundle of CA certificates
# that changes no result and is best current; flwr 1.42.0 asks for one (>=2026.10.19) newer
# than some package indexes hold, and there flwr goes in without that one requirement (the
# certifi installed serves it).
TORCH := torch==2.13.0
# The peer libraries tests/peers/ checks fedrift's algorithms against (issue 69), without their
# declared dependencies, which clash with fedrift's: fedlab asks for torchvision (no CPU wheel
# here; it imports it only for its dataset classes, which the tests stand in for) and pynvml;
# pfl asks for dp-accounting<0.6 (fedrift's privacy needs 0.6; pfl's algorithms never import
# it). Then the few modules they really import: munch, nvidia-ml-py (pynvml), prv-accountant.
PEERS := fedlab==1.3.0 pfl==0.6.0 munch nvidia-ml-py prv-accountant
UNLOCKED := certifi

setup: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade -c constraints.txt pip
	$(BIN)/python -m pip install -q -c constraints.txt $(TORCH)
	$(BIN)/python -m pip install -q -c constraints.txt -e '.[test,privacy,ray,tune,tensorboard,text,docs,hf,flwr-datasets]'
	$(BIN)/python -m pip install -q -c constraints.txt --no-deps $(PEERS)
	$(BIN)/python -m pip install -q -c constraints.txt -e '.[flower]' || { \
	  $(BIN)/python -m pip install -q -c constraints.txt --no-deps 'flwr>=1.42,<2' && \
	  $(BIN)/python -c "import importlib.metadata as m; print('\n'.join(r for r in m.requires('flwr') if 'extra ==' not in r and not r.startswith('certifi')))" > $(VENV)/flwr-requirements.txt && \
	  $(BIN)/python -m pip install -q -c constraints.txt -r $(VENV)/flwr-requirements.txt; }
	$(BIN)/python -m compileall -q src  # fedrift's bytecode: its command starts faster where PYTHONDONTWRITEBYTECODE is set
	touch $(STAMP)

# constraints.txt from what .venv holds now: every installed distribution at its version (pip's
# list: no file URLs; fedrift itself, installed editable, left out), torch first as the set-up
# installs it ($(TORCH), without the wheel's +cpu label). Run it after adding or upgrading a
# package in .venv (or changing pyproject.toml's dependencies and installing them), then make
# test, and commit constraints.txt with the change; tests/test_config_bounds.py fails while a
# distribution that fedrift's extras need is not pinned at its installed version.
lock:
	@test -x $(BIN)/python || { echo "make lock: no $(BIN)/python: make setup first"; exit 2; }
	$(BIN)/python -m pip list --format=freeze --exclude-editable > constraints.txt.new
	{ echo "# Every version make setup installs, written by make lock from .venv (README: Two commands)."; \
	  echo "# Keep every install on the local CPU build of torch; a newer torch drags in CUDA packages."; \
	  echo "$(TORCH)"; \
	  grep -v -i -E '^(torch|fedrift|$(UNLOCKED))==' constraints.txt.new; \
	} > constraints.txt && rm constraints.txt.new
	@echo "make lock: constraints.txt pins $$(grep -c '==' constraints.txt) distributions"

# The main job: five drift remedies on 20 label-skewed MNIST clients, two seeds, the table with
# paired differences to FedAvg and runs/demo/report.html (about 4 minutes on 2 idle cores here,
# up to about 8 on a slower 2-core machine). Two seeds show the differences but cannot test them:
# a difference gets * only with 6 or more paired seeds (the note under each table says so); the
# same command with seeds=0,1,2,3,4,5 has them (about 12 minutes).
demo: $(STAMP)
	$(BIN)/fedrift compare -c examples/demo.yaml algorithms=fedavg,fedprox,fedgkd,fedcsd,fedadc seeds=0,1 report.claims=papers --jobs 2 --out runs/demo

# Bytecode is written while the tests run (PYTHONDONTWRITEBYTECODE emptied for them, into the
# ignored __pycache__ folders): where it is set, each test process rewrote every test module's
# asserts again (about 7 s of a core) and every process a test starts (CLI runs, pool and Ray
# workers, Flower's apps) compiled fedrift's 140 modules again (about 0.5 s each).
# Two test processes (pytest-xdist), each test file whole in one of them (its module fixtures
# built once); the Ray cluster's and the Flower federations' files count as one file, started
# first and run one after another, never beside each other (tests/conftest.py).
# Then the agreement tests (@pytest.mark.agreement: two computations of the same thing held to
# tests/agreement.py's rule) once more under AVX2's kernels, where this CPU's own are wider
# (AVX-512): a promise that holds only under one vector width's rounding fails here, not on the
# next machine. Where this CPU's own kernels are AVX2 (or narrower) the first pass was that run.
test: $(STAMP) browser
	PYTHONDONTWRITEBYTECODE= $(BIN)/python -m pytest tests -n 2 --dist loadfile
	@own=$$($(BIN)/python -c "import torch; print(torch.backends.cpu.get_cpu_capability())"); \
	if [ "$$own" = AVX512 ]; then \
	  echo "make test: the agreement tests again, under AVX2's kernels (this CPU's own are $$own)"; \
	  ATEN_CPU_CAPABILITY=avx2 PYTHONDONTWRITEBYTECODE= $(BIN)/python -m pytest tests -m agreement -n 2 --dist loadfile; \
	else echo "make test: this CPU's own kernels are $$own: the agreement tests ran under them"; fi

# The inner loop: every test that starts no process (no CLI run, Ray cluster, Flower
# federation, browser or docs build: @pytest.mark.process, checked as each test runs).
check: $(STAMP)
	PYTHONDONTWRITEBYTECODE= $(BIN)/python -m pytest tests -m "not process" -n 2 --dist loadfile

# The report's browser test renders report.html in Debian's headless chromium: installed
# here when no browser is on PATH and this user may install packages (root, or sudo without
# a password); otherwise that test says what to install.
BROWSERS := chromium chromium-browser google-chrome google-chrome-stable
browser:
	@found=""; for b in $(BROWSERS); do command -v $$b >/dev/null 2>&1 && found=$$b; done; \
	if [ -z "$$found" ]; then \
	  if [ "$$(id -u)" -eq 0 ]; then SUDO=""; \
	  elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then SUDO="sudo -n"; \
	  else echo "make test: no chromium, and no right to install it: the browser test will fail (apt-get install chromium)"; exit 0; fi; \
	  echo "make test: installing Debian's chromium for the browser test"; \
	  $$SUDO apt-get update -qq && \
	  $$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium; \
	fi

# The documentation site: docs/ (Sphinx, MyST Markdown, furo) into docs/_build/html, offline.
# Strict: a warning (a broken link or reference, a missing page or image, a config key without
# a description) fails the build; --keep-going lists them all first. The reference pages and
# the results figures are generated from the code and the committed runs as the build starts.
DOCS_OUT := docs/_build/html
docs: $(STAMP)
	$(BIN)/python -m sphinx -b html -n -W --keep-going -q docs $(DOCS_OUT)
	@echo "docs: $(DOCS_OUT)/index.html (make docs-serve serves it)"

DOCS_PORT ?= 8000
docs-serve: docs
	@echo "docs: http://localhost:$(DOCS_PORT)/ (Ctrl-C stops)"
	$(BIN)/python -m http.server $(DOCS_PORT) --directory $(DOCS_OUT)

clean:
	rm -rf $(VENV) runs .pytest_cache docs/_build docs/_generated
