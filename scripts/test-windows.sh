#!/bin/sh
# What of Windows can be run here, under wine (`make test-windows` builds the .exe files
# first). wine 8 cannot run Deno 2 (V8 needs MEM_RESERVE_PLACEHOLDER), so the launcher runs
# with a stand-in deno.exe that prints its arguments. Checks, each fatal:
#  1. the kernel harness (portable and AVX2 paths, 1 and 3 threads) writes Linux's bytes;
#  2. libk3's fmaf gives Linux's digest (and how often mingw's own fmaf differs is printed);
#  3. libk3.dll loaded by LoadLibrary reads past 4 GiB, buffered and unbuffered, refuses a
#     foreign buffer, names a missing file, and reports memory;
#  4. the launcher unpacks once, passes quoted arguments verbatim and the exit code through,
#     and refuses a damaged executable with exit 2.
set -eu
cd "$(dirname "$0")/.."
W=build/windows-x64
export WINEDEBUG=-all WINEPREFIX="$PWD/build/wine"
mkdir -p "$WINEPREFIX"
tmp=$(mktemp -d)
trap 'wineserver -k 2>/dev/null; rm -rf "$tmp"' EXIT  # our prefix's wineserver: none left running
fail() { echo "test-windows: FAIL: $*" >&2; exit 1; }
# wine makes folders in $TMPDIR of its own; they go with ours.
mkdir -p "$tmp/wine-tmp"
export TMPDIR="$tmp/wine-tmp"

# 1. Harness bytes.
linux=$(OMP_NUM_THREADS=2 ./build/pool/harness 2>/dev/null | sha256sum | cut -c1-64)
for isa in scalar auto; do
  for threads in 1 3; do
    got=$(K3_ISA=$isa OMP_NUM_THREADS=$threads wine "$W/harness.exe" 2>/dev/null | sha256sum | cut -c1-64)
    echo "harness windows isa=$isa threads=$threads $got"
    [ "$got" = "$linux" ] || fail "harness under wine ($isa, $threads threads) differs from Linux $linux"
  done
done
echo "harness linux $linux"

# 2. fmaf.
lin_fma=$(./build/fma_check)
win_fma=$(wine "$W/fma_check.exe" | tr -d '\r')
echo "fma linux:   $lin_fma"
echo "fma windows: $win_fma"
[ "${lin_fma##*digest }" = "${win_fma##*digest }" ] || fail "k3's fmaf differs between Linux and Windows"

# 3. The DLL's file and memory layer, on a sparse 5 GiB file with a marker 4 KiB before its end.
big="$tmp/big.bin"
truncate -s 5G "$big"
printf 'K3-FAR!!' | dd of="$big" bs=1 seek=$(( (5 << 30) - 4096 )) conv=notrunc 2>/dev/null
probe=$(cd "$W" && OMP_NUM_THREADS=3 wine dll_probe.exe "$(winepath -w "$big")" | tr -d '\r')
printf "%s\n" "$probe" | sed 's/^/dll probe: /'
for want in "version libk3 0.1.0 (pool)" "threads 3" \
  "read direct=0 offset=5368705024 got=4096 text=K3-FAR!!" \
  "read direct=1 offset=5368705024 got=4096 text=K3-FAR!!" "size 5368709120" \
  "foreign-buffer -14" "missing-file -2" "peak-rss-positive 1" "mem-available-positive 1"; do
  printf "%s\n" "$probe" | grep -qxF "$want" || fail "dll probe: no line '$want'"
done

# 4. The launcher with a stand-in deno.exe.
mkdir -p "$tmp/stage/bin" "$tmp/stage/app/build" "$tmp/home"
cp "$W/deno-standin.exe" "$tmp/stage/bin/deno.exe"
echo 'console.log("stand-in app");' > "$tmp/stage/app/main.ts"
echo '{}' > "$tmp/stage/app/deno.json"
cp "$W/libk3.dll" "$tmp/stage/app/build/"
tools/deno/node_modules/.bin/deno run --quiet --allow-read --allow-write --allow-run=gzip scripts/pack_windows.ts \
  "$W/k3-launcher.exe" "$tmp/stage" "$tmp/k3.exe"
home_w=$(winepath -w "$tmp/home")
set +e
K3_HOME="$home_w" wine "$tmp/k3.exe" run "two words" 'say "hi"' 'C:\dir\' 'a\\"b' '' 'ü€' exit=7 \
  > "$tmp/out"
code=$?
set -e
out=$(tr -d '\r' < "$tmp/out")
[ "$code" = 7 ] || fail "launcher exit code $code, wanted 7"
printf "%s\n" "$out" | sed 's/^/launcher: /'
expected='<run>
<two words>
<say "hi">
<C:\dir\>
<a\\"b>
<>
<ü€>
<exit=7>'
[ "$(printf "%s\n" "$out" | tail -n 9 | head -n 8)" = "$expected" ] || fail "arguments did not arrive verbatim"
printf "%s\n" "$out" | grep -q '^<--allow-ffi>$' || fail "deno was not given k3's permissions"
root=$(ls -d "$tmp/home/dist/"*)
[ -f "$root/.complete" ] && [ -f "$root/app/build/libk3.dll" ] && [ -f "$root/bin/deno.exe" ] ||
  fail "nothing unpacked under K3_HOME"
printf "%s\n" "$out" | grep -qxF "DENO_DIR=$(winepath -w "$root")\\deno_dir" || fail "DENO_DIR not in the unpacked copy"
touch "$root/sentinel"
K3_HOME="$home_w" wine "$tmp/k3.exe" exit=0 >/dev/null || fail "second start failed"
[ -f "$root/sentinel" ] || fail "the second start unpacked again"
[ "$(ls "$tmp/home/dist" | wc -l)" = 1 ] || fail "a partial copy was left: $(ls "$tmp/home/dist")"
head -c 400000 "$tmp/k3.exe" > "$tmp/damaged.exe"
set +e
K3_HOME="$home_w" wine "$tmp/damaged.exe" 2> "$tmp/err" >/dev/null
code=$?
set -e
[ "$code" = 2 ] && grep -q "carries no payload" "$tmp/err" || fail "a damaged k3.exe gave exit $code"
echo "test-windows: all checks passed (launcher: $(du -h "$tmp/k3.exe" | cut -f1) with a stand-in deno)"
