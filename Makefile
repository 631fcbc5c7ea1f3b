# shardlab — two commands for a newcomer: `make demo` and `make test`.
# Every target installs the missing Debian packages first (only those missing).

JOBS ?= 2
PACKAGES := cmake make g++ libtbb-dev libeigen3-dev libspdlog-dev libcli11-dev \
            nlohmann-json3-dev libgtest-dev libgmock-dev libbenchmark-dev gnuplot-nox
BIN := build/bin/shardlab
# `make lab-N` builds and runs lab N's grader on your exercise or answers (labs/README.md).
LABS := 1 2 3 4 5 6 7 8
LAB_TARGETS := $(addprefix lab-,$(LABS))

.PHONY: all deps build demo test test-full bench debug asan tsan portable clean labs $(LAB_TARGETS)

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

test: build
	ctest --preset release -j $(JOBS) -LE full

test-full: build
	ctest --preset release -j $(JOBS) -L full

$(LAB_TARGETS): lab-%: deps
	@cmake --preset release >/dev/null
	@cmake --build --preset release --target lab_0$*
	build/bin/lab_0$*

labs: build
	ctest --preset release -j $(JOBS) -L labs

bench: build
	@for b in build/bin/bench_*; do echo "== $$b"; $$b; done

debug: deps
	cmake --preset debug >/dev/null && cmake --build --preset debug && ctest --preset debug -j $(JOBS) -LE full

asan: deps
	cmake --preset asan >/dev/null && cmake --build --preset asan && ctest --preset asan -j $(JOBS) -LE full

tsan: deps
	cmake --preset tsan >/dev/null && cmake --build --preset tsan && ctest --preset tsan -j $(JOBS) -LE full

portable: deps
	cmake --preset portable >/dev/null && cmake --build --preset portable

clean:
	rm -rf build build-debug build-asan build-tsan build-portable
