# shardlab — two commands for a newcomer: `make demo` and `make test`.
# Every target installs the missing Debian packages first (only those missing).

JOBS ?= 2
PACKAGES := cmake make g++ libtbb-dev libeigen3-dev libspdlog-dev libcli11-dev \
            nlohmann-json3-dev libgtest-dev libgmock-dev libbenchmark-dev gnuplot-nox \
            clang libclang-rt-14-dev libopenmpi-dev openmpi-bin python3 iproute2
# The Python module (make python) and what its tests and notebooks use (make python-deps):
# Debian's, for /usr/bin/python3 (the python3 packages import under it only).
PY_BUILD_PACKAGES := python3-dev pybind11-dev python3-pybind11
PY_PACKAGES := python3-pytest python3-numpy python3-pandas python3-matplotlib jupyter-nbconvert python3-ipykernel
PYTHON := /usr/bin/python3
BIN := build/bin/shardlab
# `make lab-N` builds and runs lab N's grader on your exercise or answers (labs/README.md).
LABS := 1 2 3 4 5 6 7 8
LAB_TARGETS := $(addprefix lab-,$(LABS))
# `make fuzz` runs each libFuzzer harness (fuzz/) this many seconds; `make test` a few.
FUZZ_SECONDS ?= 600
FUZZ_SMOKE_SECONDS ?= 5

.PHONY: all deps python python-deps build demo test test-full pins pins-portable bench debug asan tsan portable clean labs fuzz fuzz-build plot-busbw \
        fuzz-smoke $(LAB_TARGETS)

all: build

deps:
	@missing=""; for p in $(PACKAGES); do \
	  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "install ok installed" || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" -ne 0 ]; then \
	    echo "shardlab: missing Debian packages:$$missing"; \
	    echo "shardlab: run 'sudo apt-get install$$missing' (or 'sudo make deps'), then retry."; exit 1; \
	  fi; \
	  echo "shardlab: installing$$missing"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	fi

# `make python`: build/python/_shardlab, and python/ on /usr/bin/python3's path
# (a .pth file in the user's site-packages): then `import shardlab` works anywhere.
python: deps
	@$(MAKE) --no-print-directory deps PACKAGES="$(PY_BUILD_PACKAGES)"
	@cmake --preset release -DSHARDLAB_PYTHON=ON >/dev/null
	@cmake --build --preset release --target _shardlab shardlab
	@$(PYTHON) python/add_to_user_site.py $(CURDIR)/python

python-deps:
	@$(MAKE) --no-print-directory deps PACKAGES="$(PY_PACKAGES)"

build: deps
	@cmake --preset release >/dev/null
	@cmake --build --preset release

demo: build
	$(BIN) p2p --profile a100-nvlink --src 0 --dst 1 --max-bytes 64MiB
	$(BIN) p2p --profile a100-nvlink --src 0 --dst 8 --max-bytes 64MiB
	$(BIN) collectives --op all_reduce --ranks 8 --min-bytes 1KiB --max-bytes 64MiB
	$(BIN) collectives --op all_reduce --ranks 16 --min-bytes 1KiB --max-bytes 64MiB
	$(BIN) train --model tiny --data synthetic:markov --steps 300
	$(BIN) train --model tiny --experts 8 --top-k 2 --dp 4 --ep 4 --batch 16 --steps 50
	$(BIN) verify --model tiny --data synthetic:markov --steps 20 --tp 2 --pp 2 --dp 2 --sp --zero 1 --micro-batches 4 --trace build/verify.trace.json
	@echo "shardlab: open build/verify.trace.json in https://ui.perfetto.dev: 8 virtual GPUs (tp 2 x pp 2 x dp 2), compute and comm streams, the 1F1B pipeline"

# The pytest suite and the notebooks are ctest tests (label python) once the module is built.
test: python-deps python build
	@ctest --preset release -j $(JOBS) -LE full || { \
	  echo "shardlab: the failed tests once more, one at a time, their output shown (a pass now means a flaky test: still a failure)"; \
	  ctest --preset release --rerun-failed --output-on-failure -j 1; exit 1; }
	@log=build/Testing/Temporary/LastTest.log; \
	  echo "shardlab: $$(grep -c '^hosts: namespace case ran' $$log) two-host namespace cases ran, $$(grep -c '^hosts: network namespaces not permitted' $$log) skipped (no CAP_NET_ADMIN)"
	@$(MAKE) --no-print-directory fuzz-smoke

# all_reduce busbw against size on 1, 2 and 8 DGX A100 nodes, next to the
# public nccl-tests points (docs/img/busbw_a100.png; README "shardlab collectives").
plot-busbw: build
	@tools/plot_busbw.sh build docs/img

# The pinned runs (bit-identical losses and parameters, tests/model/train/
# pinned_runs_test.cc): every one executed, in the native build and in the
# portable one (baseline ISA): their bits are the same in both.
pins: build
	@tests/run_pins.sh build

pins-portable: deps
	@cmake --preset portable -DSHARDLAB_BUILD_BENCH=OFF >/dev/null
	@cmake --build --preset portable --target pinned_runs_test
	@tests/run_pins.sh build-portable

test-full: build
	ctest --preset release -j $(JOBS) -L full

$(LAB_TARGETS): lab-%: deps
	@cmake --preset release >/dev/null
	@cmake --build --preset release --target lab_0$*
	build/bin/lab_0$*

labs: build
	ctest --preset release -j $(JOBS) -L labs

# The torch ratio (issue 34) comes last, only where Debian's torch is installed:
# torch is a comparator, never a dependency, so without it the bench says how
# to get it instead of failing.
bench: build
	@for b in build/bin/bench_*; do echo "== $$b"; $$b; done
	@echo "== bench/torch_compare.py (tiny, 1 thread)"
	@if /usr/bin/python3 -c 'import torch' 2>/dev/null; then \
	  /usr/bin/python3 bench/torch_compare.py --model tiny --threads 1 --rounds 3; \
	else \
	  echo "no torch ratio: /usr/bin/python3 cannot import torch;" \
	       "install the comparator with: sudo apt-get install -y python3-torch libopenblas0-pthread"; \
	fi

debug: deps
	cmake --preset debug >/dev/null && cmake --build --preset debug && ctest --preset debug -j $(JOBS) -LE full

asan: deps
	cmake --preset asan >/dev/null && cmake --build --preset asan && ctest --preset asan -j $(JOBS) -LE full

tsan: deps
	cmake --preset tsan >/dev/null && cmake --build --preset tsan && ctest --preset tsan -j $(JOBS) -LE full

fuzz-build: deps
	@cmake --preset fuzz >/dev/null
	@cmake --build --preset fuzz

fuzz: fuzz-build
	fuzz/run.sh build-fuzz $(FUZZ_SECONDS)

# make test's share: every harness for FUZZ_SMOKE_SECONDS, if clang can link libFuzzer.
fuzz-smoke:
	@probe=$$(mktemp); \
	if echo 'extern "C" int LLVMFuzzerTestOneInput(const char*, unsigned long) { return 0; }' | \
	    clang++ -fsanitize=fuzzer -x c++ - -o $$probe >/dev/null 2>&1; then \
	  rm -f $$probe; $(MAKE) --no-print-directory fuzz-build && fuzz/run.sh build-fuzz $(FUZZ_SMOKE_SECONDS); \
	else rm -f $$probe; echo "shardlab: fuzz smoke skipped: clang++ with libFuzzer not found (make deps installs it)"; fi

portable: deps
	cmake --preset portable >/dev/null && cmake --build --preset portable

clean:
	rm -rf build build-debug build-asan build-tsan build-portable build-fuzz
