#!/bin/sh
# The Linux arm64 executable's payload (its Deno, the app, its libk3) run under qemu-aarch64:
# a run on the tiny model `k3 demo` makes prints the same text as this checkout on x86-64,
# with the same generated token ids and the same logits, byte for byte. One emulated run
# checks all three (each start of Deno under qemu costs about a minute); `demo` itself is
# that model plus `run`, in TypeScript that is the same on both. The payload is
# unpacked by hand here (the sh launcher in front of it is the x86 one, tested by
# tests/repo/dist.test.ts): without binfmt_misc, an arm64 program only runs when named to qemu.
set -eu
cd "$(dirname "$0")/.."
exe=dist/k3-linux-arm64
[ -f "$exe" ] || { echo "test-arm-dist: $exe missing (make dist-linux-arm64)" >&2; exit 2; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "test-arm-dist: FAIL: $*" >&2; exit 1; }

offset=$(grep -a -m1 -o 'tail -c +[0-9]*' "$exe" | cut -d+ -f2)
tail -c +"$offset" "$exe" | gzip -dc | tar -xf - -C "$tmp"
file -L "$tmp/bin/deno" | grep -q "ARM aarch64" || fail "the payload's deno is not an arm64 program"
file -L "$tmp/app/build/libk3.so" | grep -q "ARM aarch64" || fail "the payload's libk3 is not arm64"

# The payload's app run twice: by this machine's Deno with this machine's libk3 (the x86-64
# reference, which also fills DENO_DIR's transpile cache: TypeScript to JavaScript is the same
# for both, and emulated it takes minutes), then by the payload's own arm64 Deno and libk3.
flags="run --cached-only --frozen --no-prompt --quiet --config $tmp/app/deno.json --allow-ffi
  --allow-read --allow-write --allow-env --allow-net --allow-run --allow-sys $tmp/app/main.ts"
x86_k3() {
  # shellcheck disable=SC2086
  DENO_DIR="$tmp/deno_dir" K3_LIB="$PWD/build/libk3.so" OMP_NUM_THREADS=2 \
    tools/deno/node_modules/.bin/deno $flags "$@"
}
arm_k3() {
  # shellcheck disable=SC2086
  DENO_DIR="$tmp/deno_dir" DENO_NO_UPDATE_CHECK=1 OMP_NUM_THREADS=2 \
    qemu-aarch64 -L /usr/aarch64-linux-gnu "$tmp/bin/deno" $flags "$@"
}

# One tiny model, generated on x86 (generating it under emulation takes minutes).
x86_k3 demo --gen 1 --cache-dir "$tmp/x86" > /dev/null 2>&1 || fail "k3 demo on x86-64 failed"
model="$tmp/x86/$(ls "$tmp/x86")"
run="--prompt Paris --gen 8 --ignore-eos"
# shellcheck disable=SC2086
x86_k3 run "$model" $run --out "$tmp/x86.json" --dump-logits "$tmp/x86.bin" >"$tmp/x86.txt" 2>/dev/null
# shellcheck disable=SC2086
arm_k3 run "$model" $run --out "$tmp/arm.json" --dump-logits "$tmp/arm.bin" >"$tmp/arm.txt" \
  2>"$tmp/arm.err" || { cat "$tmp/arm.err" >&2; fail "k3 run under qemu-aarch64 failed"; }
[ -s "$tmp/x86.txt" ] || fail "the x86 run printed no text"
cmp -s "$tmp/x86.txt" "$tmp/arm.txt" || fail "the text differs between x86-64 and arm64"
echo "text, x86-64 and arm64 (qemu): $(cat "$tmp/arm.txt")"
ids() { tr -d ' \n' < "$1" | grep -o '"generated_ids":\[[0-9,]*\]'; }
[ -n "$(ids "$tmp/x86.json")" ] || fail "no generated ids in the x86 record"
[ "$(ids "$tmp/x86.json")" = "$(ids "$tmp/arm.json")" ] || fail "token ids differ: $(ids "$tmp/arm.json")"
cmp -s "$tmp/x86.bin" "$tmp/arm.bin" || fail "logits differ between x86-64 and arm64"
echo "token ids, x86-64 and arm64 (qemu): $(ids "$tmp/arm.json")"
echo "logits: $(wc -c < "$tmp/arm.bin") bytes, identical; libk3 on arm64: $(grep -a -o 'libk3 0.1.0 ([a-z]*)' "$tmp/app/build/libk3.so" | head -1)"
