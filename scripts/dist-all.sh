#!/bin/sh
# Writes the k3 executable of every platform into dist/ (or of the platforms named):
#   linux-x64 linux-arm64 macos-arm64 macos-x64   POSIX sh + gzip'd tar (scripts/dist.sh)
#   windows-x64                                    k3-windows-x64.exe: a mingw launcher
#                                                  with a zlib payload (scripts/pack_windows.ts)
# Each carries its platform's Deno (npm, pinned in tools/platforms; linux-x64 uses tools/deno),
# the app, node_modules and its own libk3 (built by `make dist-all`). usage:
#   sh scripts/dist-all.sh [PLATFORM...]
set -eu
cd "$(dirname "$0")/.."
NPM=tools/platforms/node_modules/@deno
DENO=tools/deno/node_modules/.bin/deno
[ $# -gt 0 ] || set -- linux-x64 linux-arm64 windows-x64 macos-arm64 macos-x64

need() {
  [ -f "$1" ] || { echo "dist-all: $1 missing; run 'make dist-all'" >&2; exit 2; }
}

# The Windows executable: the same app layout as dist.sh's, packed behind the launcher.
windows() {
  need "$NPM/win32-x64/deno.exe"
  need build/windows-x64/libk3.dll
  need build/windows-x64/k3-launcher.exe
  stage=$(mktemp -d)
  trap 'rm -rf "$stage"' EXIT
  mkdir -p "$stage/bin" "$stage/app/build"
  cp "$NPM/win32-x64/deno.exe" "$stage/bin/deno.exe"
  cp -R main.ts mod.ts deno.json deno.lock lib ffi node_modules "$stage/app/"
  cp build/windows-x64/libk3.dll "$stage/app/build/"
  out=dist/k3-windows-x64.exe
  mkdir -p dist
  "$DENO" run --quiet --allow-read --allow-write --allow-run=gzip scripts/pack_windows.ts \
    build/windows-x64/k3-launcher.exe "$stage" "$out"
  rm -rf "$stage"
  trap - EXIT
  echo "dist: wrote $out ($(du -h "$out" | cut -f1))"
}

for platform in "$@"; do
  case "$platform" in
    linux-x64) sh scripts/dist.sh "$DENO" build/libk3.so dist/k3-linux-x64 ;;
    linux-arm64)
      need "$NPM/linux-arm64-glibc/deno"
      sh scripts/dist.sh "$NPM/linux-arm64-glibc/deno" build/linux-arm64/libk3.so dist/k3-linux-arm64 ;;
    macos-arm64)
      need "$NPM/darwin-arm64/deno"
      sh scripts/dist.sh "$NPM/darwin-arm64/deno" build/macos-arm64/libk3.dylib dist/k3-macos-arm64 ;;
    macos-x64)
      need "$NPM/darwin-x64/deno"
      sh scripts/dist.sh "$NPM/darwin-x64/deno" build/macos-x64/libk3.dylib dist/k3-macos-x64 ;;
    windows-x64) windows ;;
    *) echo "dist-all: unknown platform $platform" >&2; exit 2 ;;
  esac
done
