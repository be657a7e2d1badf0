# sluice front door. Every target installs what is missing first (scripts/install-deps.sh).
#   make run        build and train the default job (a GPT on the sort task in 4 pipeline stages, 1F1B),
#                   metrics, checkpoint, a trace and an HTML report (report.html) in runs/default/
#   make test       build (RelWithDebInfo) and run the whole CTest suite
#   make test-tsan  the suite under ThreadSanitizer
#   make test-asan  the suite under AddressSanitizer + UndefinedBehaviorSanitizer
#   make test-cluster  only the tests across emulated hosts (tests/cluster/, needs root; docs/mpi.md)
#   make bench      build and run the benchmarks, JSON results in build/bench-results/
#   make fuzz       build the libFuzzer targets with clang and fuzz each briefly (FUZZ_SECONDS each,
#                   default 20): the program parser, the checkpoint readers, the --layout parser,
#                   the costs file of simulate --costs, sluice report's metrics and trace, the
#                   --data files
#   make format     clang-format every source file

JOBS ?= $(shell nproc)
CMAKE_GEN := -G Ninja
CTEST := ctest --output-on-failure -j$(JOBS)

.PHONY: all deps build run test test-cluster test-tsan test-asan bench fuzz format check-format clean

all: build

deps:
	@bash scripts/install-deps.sh

build/build.ninja: | deps
	cmake -S . -B build $(CMAKE_GEN) -DCMAKE_BUILD_TYPE=RelWithDebInfo

build: deps build/build.ninja
	cmake --build build -j$(JOBS)

run: build
	@mkdir -p runs/default
	build/sluice train --stages 4 --schedule 1f1b --layers 4 --microbatches 4 \
	  --metrics runs/default/metrics.jsonl --save runs/default/checkpoint.safetensors \
	  --trace runs/default/trace.json
	@build/sluice report runs/default/metrics.jsonl --trace runs/default/trace.json \
	  --out runs/default/report.html

test: build
	cd build && $(CTEST)

test-cluster: build
	cd build && $(CTEST) -L cluster

# The sanitizer trees build at -O1 (the sanitizers' own advice): at -O0 the byte loops and
# containers of the slowest tests ran 4.5x slower (docs/development.md, "Sanitizers").
build-tsan/build.ninja: | deps
	cmake -S . -B build-tsan $(CMAKE_GEN) -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS_DEBUG="-g -O1" -DSLUICE_SANITIZE=thread -DSLUICE_BUILD_BENCHMARKS=OFF

test-tsan: deps build-tsan/build.ninja
	cmake --build build-tsan -j$(JOBS)
	cd build-tsan && TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 suppressions=$(CURDIR)/tests/tsan.supp" $(CTEST)

build-asan/build.ninja: | deps
	cmake -S . -B build-asan $(CMAKE_GEN) -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS_DEBUG="-g -O1" -DSLUICE_SANITIZE=address -DSLUICE_BUILD_BENCHMARKS=OFF

test-asan: deps build-asan/build.ninja
	cmake --build build-asan -j$(JOBS)
	cd build-asan && ASAN_OPTIONS="detect_leaks=1:abort_on_error=1" UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1" $(CTEST)

bench: build
	@mkdir -p build/bench-results
	@for b in build/bench/*_bench; do \
	  echo "== $$b"; \
	  $$b --benchmark_format=console --benchmark_out=build/bench-results/$$(basename $$b).json --benchmark_out_format=json || exit 1; \
	done

build-fuzz/build.ninja: | deps
	CXX=clang++ cmake -S . -B build-fuzz $(CMAKE_GEN) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSLUICE_BUILD_FUZZERS=ON -DSLUICE_BUILD_TESTS=OFF -DSLUICE_BUILD_BENCHMARKS=OFF

FUZZ_TARGETS := parser checkpoint layout costs report data

# Each target starts from its committed seed corpus (fuzz/corpus/NAME, read only) and keeps what it
# finds in build-fuzz/corpus/NAME; a crash, hang or leak stops `make fuzz` with the input saved as
# crash-*/timeout-*/leak-* in the working directory (docs/development.md, "Fuzzing").
fuzz: deps build-fuzz/build.ninja
	cmake --build build-fuzz --target $(FUZZ_TARGETS:%=%_fuzz) -j$(JOBS)
	@for t in $(FUZZ_TARGETS); do \
	  echo "== $${t}_fuzz"; \
	  mkdir -p build-fuzz/corpus/$$t && \
	  build-fuzz/fuzz/$${t}_fuzz build-fuzz/corpus/$$t fuzz/corpus/$$t -dict=fuzz/$$t.dict \
	    -timeout=10 -rss_limit_mb=2048 -max_total_time=$${FUZZ_SECONDS:-20} -print_final_stats=1 \
	    || exit 1; \
	done

format:
	clang-format -i $$(git ls-files '*.h' '*.cc')

# Fails on any file that `make format` would change (the check_format test of `make test` runs it too).
check-format: deps
	@bash scripts/check-format.sh

clean:
	rm -rf build build-tsan build-asan build-fuzz
