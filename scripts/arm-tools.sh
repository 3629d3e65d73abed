#!/bin/sh
# Makes sure the aarch64 cross compiler and qemu-user are present, so `make test` can check that
# the NEON kernels give the same bytes as x86 (tests/kernels/neon.test.ts). Installs Debian's packages
# when they are missing and we may (root + apt-get); otherwise says what to install.
set -eu
PKGS="gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user"
if command -v aarch64-linux-gnu-gcc >/dev/null 2>&1 && command -v qemu-aarch64 >/dev/null 2>&1; then
  exit 0
fi
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "arm-tools: installing $PKGS (once, for the NEON test)" >&2
  # A partly failing index refresh is not fatal: the install below says whether it worked.
  apt-get update -qq >/dev/null || echo "arm-tools: apt-get update reported errors" >&2
  if DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $PKGS >/dev/null \
    </dev/null; then
    exit 0
  fi
  echo "arm-tools: could not install $PKGS; the NEON test needs them" >&2
  exit 2
fi
echo "arm-tools: the NEON test needs: $PKGS (Debian packages); install them and rerun" >&2
exit 2
