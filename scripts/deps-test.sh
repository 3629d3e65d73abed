#!/bin/sh
# `make deps-test`: installs the system tools some tests drive, which `make test` itself never
# installs: tmux (tests/chat/chat_tty.test.ts types into `k3 chat` at a real terminal), the
# aarch64 cross compiler and its C library, and qemu-user (tests/kernels/neon.test.ts checks that
# the NEON kernels give the same bytes as x86), mingw-w64 and wine (tests/kernels/windows.test.ts). Without them those tests say they skipped.
# Installs Debian's packages when something is missing and we may (root + apt-get); otherwise
# says what to install. .ci/run runs this before `make test`.
set -eu
missing=""
command -v tmux >/dev/null 2>&1 || missing="$missing tmux"
command -v aarch64-linux-gnu-gcc >/dev/null 2>&1 || missing="$missing gcc-aarch64-linux-gnu"
# The NEON harness links statically: it needs the cross C library, not just the compiler.
[ -f /usr/aarch64-linux-gnu/lib/libc.a ] || missing="$missing libc6-dev-arm64-cross"
command -v qemu-aarch64 >/dev/null 2>&1 || missing="$missing qemu-user"
# The Windows checks (tests/kernels/windows.test.ts): mingw-w64 with zlib, and wine to run them.
command -v x86_64-w64-mingw32-gcc >/dev/null 2>&1 || missing="$missing gcc-mingw-w64-x86-64"
[ -f /usr/x86_64-w64-mingw32/include/zlib.h ] || missing="$missing libz-mingw-w64-dev"
command -v wine >/dev/null 2>&1 || missing="$missing wine wine64"
[ -z "$missing" ] && exit 0
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "deps-test: installing$missing (once, for the terminal, NEON and Windows tests)" >&2
  # A partly failing index refresh is not fatal: the install below says whether it worked.
  apt-get update -qq >/dev/null || echo "deps-test: apt-get update reported errors" >&2
  # shellcheck disable=SC2086 # one word per package
  if DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $missing \
    >/dev/null </dev/null; then
    exit 0
  fi
  echo "deps-test: could not install$missing" >&2
  exit 2
fi
echo "deps-test: the terminal, NEON and Windows tests need:$missing (Debian packages); install them" \
  "(e.g. sudo apt-get install$missing) and rerun" >&2
exit 2
