# k3: build libk3, bootstrap the pinned Deno from npm, run the tests.
#   make          install the toolchain and dependencies, build libk3
#   make test     everything above, then the test suite
#   make demo     the built-in tiny model, text in, text out

DENO     := tools/deno/node_modules/.bin/deno
LIB      := build/libk3.so
CC       ?= cc
CFLAGS   := -std=c99 -O2 -Wall -Wextra -Werror -fopenmp -fPIC -ffp-contract=off
LDFLAGS  := -shared -Wl,-z,nodelete -lm
CSRC     := $(wildcard csrc/*.c)
CHDR     := $(wildcard csrc/*.h)
PERMS    := --allow-ffi --allow-read --allow-write --allow-env --allow-net --allow-run --allow-sys

.PHONY: all deps lib test demo check fmt clean

all: deps lib

$(DENO): tools/deno/package.json tools/deno/package-lock.json
	npm ci --prefix tools/deno --no-audit --no-fund
	@touch -h $@

node_modules/.deno-installed: $(DENO) deno.json deno.lock
	$(DENO) install --frozen
	@touch $@

deps: $(DENO) node_modules/.deno-installed

lib: $(LIB)

$(LIB): $(CSRC) $(CHDR) Makefile
	@mkdir -p build
	$(CC) $(CFLAGS) -o $@ $(CSRC) $(LDFLAGS)

test: deps lib
	$(DENO) test $(PERMS) tests/

check: deps
	$(DENO) fmt --check
	$(DENO) lint
	$(DENO) check main.ts mod.ts tests/ scripts/ bench/

fmt: deps
	$(DENO) fmt

demo: deps lib
	./k3 demo

clean:
	rm -rf build
