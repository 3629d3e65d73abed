#!/bin/sh
# Builds dist/k3: one self-extracting executable (POSIX sh + a gzip'd tar) holding the pinned
# Deno binary, the app sources, node_modules and libk3. It runs offline: the first start
# unpacks to ${K3_HOME:-~/.cache/k3}/dist/<hash>; later starts exec straight away.
#
# `deno compile` would give a true single ELF, but it needs the matching `denort` runtime,
# which our machines cannot download (docs/DISTRIBUTION.md has the recipe for a connected
# machine). This script is the offline path, and it is what `make dist` runs.
set -eu
cd "$(dirname "$0")/.."
DENO=tools/deno/node_modules/.bin/deno
[ -x "$DENO" ] || { echo "dist: run 'make' first" >&2; exit 2; }
[ -f build/libk3.so ] || { echo "dist: build/libk3.so missing; run 'make'" >&2; exit 2; }

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/bin" "$stage/app/build"
cp -L "$DENO" "$stage/bin/deno"
cp -R main.ts mod.ts deno.json deno.lock lib ffi "$stage/app/"
cp build/libk3.so "$stage/app/build/"
cp -R node_modules "$stage/app/node_modules"

payload="$stage/payload.tar.gz"
tar -C "$stage" -cf - bin app | gzip -6 > "$payload"
hash=$(sha256sum "$payload" | cut -c1-16)

mkdir -p dist
out=dist/k3
tmp="$out.tmp.$$"
cat > "$tmp" <<LAUNCHER
#!/bin/sh
# k3 single executable: unpacks once, then runs the pinned Deno on the bundled app.
set -eu
ROOT="\${K3_HOME:-\${XDG_CACHE_HOME:-\$HOME/.cache}/k3}/dist/$hash"
if [ ! -f "\$ROOT/.complete" ]; then
  mkdir -p "\$(dirname "\$ROOT")"
  TMP="\$ROOT.tmp.\$\$"
  rm -rf "\$TMP"; mkdir -p "\$TMP"
  tail -c +OFFSET_PLACEHOLDER "\$0" | gzip -dc | tar -xf - -C "\$TMP"
  touch "\$TMP/.complete"
  mv "\$TMP" "\$ROOT" 2>/dev/null || rm -rf "\$TMP"
fi
export DENO_NO_UPDATE_CHECK=1 DENO_NO_PROMPT=1
export DENO_DIR="\$ROOT/deno_dir"
exec "\$ROOT/bin/deno" run --cached-only --frozen --no-prompt --quiet \\
  --config "\$ROOT/app/deno.json" \\
  --allow-ffi --allow-read --allow-write --allow-env --allow-net --allow-run --allow-sys \\
  "\$ROOT/app/main.ts" "\$@"
__PAYLOAD__
LAUNCHER
# The payload starts right after the launcher; patch its 1-based byte offset in (fixed width).
offset=$(( $(wc -c < "$tmp") + 1 ))
sed -i "s/OFFSET_PLACEHOLDER/$(printf '%018d' "$offset")/" "$tmp"
cat "$payload" >> "$tmp"
chmod +x "$tmp"
mv "$tmp" "$out"
echo "dist: wrote $out ($(du -h "$out" | cut -f1))"
