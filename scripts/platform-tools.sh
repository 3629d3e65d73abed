#!/bin/sh
# Installs the Debian packages that build and check the other platforms' executables:
# mingw-w64 and zlib for mingw (Windows libk3 and launcher), wine (the Windows checks),
# qemu-user and the aarch64 cross compiler (Linux arm64). Root and apt-get; one index refresh.
set -eu
PKGS="gcc-mingw-w64-x86-64 libz-mingw-w64-dev wine wine64 qemu-user gcc-aarch64-linux-gnu libc6-dev-arm64-cross"
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
  echo "platform-tools: needs root and apt-get; install these Debian packages: $PKGS" >&2
  exit 2
fi
apt-get update -qq >/dev/null || echo "platform-tools: apt-get update reported errors" >&2
# shellcheck disable=SC2086
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $PKGS >/dev/null \
  </dev/null
echo "platform-tools: installed $PKGS"
