#!/bin/sh
# Builds dist/k3: one self-extracting executable (POSIX sh + a gzip'd tar) holding the pinned
# Deno binary, the app sources, node_modules and libk3. It runs offline: the first start
# unpacks to $K3_HOME/dist/<hash> (else $XDG_CACHE_HOME/k3, ~/.cache/k3, or $TMPDIR/k3-UID
# without HOME); later starts exec straight away. A new release's first start removes the
# copies of older ones that no running k3 holds.
#
# usage: sh scripts/dist.sh [DENO LIBK3 OUT]   (default: this machine's, written to dist/k3)
# scripts/dist-all.sh passes another platform's Deno and libk3 (Linux arm64, macOS).
#
# `deno compile` would give a true single ELF, but it needs the matching `denort` runtime,
# which our machines cannot download (docs/DISTRIBUTION.md has the recipe for a connected
# machine). This script is the offline path, and it is what `make dist` runs.
set -eu
cd "$(dirname "$0")/.."
DENO=${1:-tools/deno/node_modules/.bin/deno}
LIBK3=${2:-build/libk3.so}
out=${3:-dist/k3}
[ -f "$DENO" ] || { echo "dist: $DENO missing; run 'make' first" >&2; exit 2; }
[ -f "$LIBK3" ] || { echo "dist: $LIBK3 missing; run 'make'" >&2; exit 2; }

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/bin" "$stage/app/build"
cp -L "$DENO" "$stage/bin/deno"
chmod +x "$stage/bin/deno"
cp -R main.ts mod.ts deno.json deno.lock lib ffi "$stage/app/"
cp "$LIBK3" "$stage/app/build/"
cp -R node_modules "$stage/app/node_modules"

payload="$stage/payload.tar.gz"
tar -C "$stage" -cf - bin app | gzip -6 > "$payload"
hash=$(sha256sum "$payload" | cut -c1-16)

mkdir -p "$(dirname "$out")"
tmp="$out.tmp.$$"
cat > "$tmp" <<LAUNCHER
#!/bin/sh
# k3 single executable: unpacks once, then runs the pinned Deno on the bundled app.
set -eu
if [ -n "\${K3_HOME:-}" ]; then BASE="\$K3_HOME/dist"
elif [ -n "\${XDG_CACHE_HOME:-}" ]; then BASE="\$XDG_CACHE_HOME/k3/dist"
elif [ -n "\${HOME:-}" ]; then BASE="\$HOME/.cache/k3/dist"
else BASE="\${TMPDIR:-/tmp}/k3-\$(id -u)/dist"  # no HOME (a service, env -i)
fi
ROOT="\$BASE/$hash"
if [ ! -f "\$ROOT/.complete" ]; then
  mkdir -p "\$BASE"
  TMP="\$ROOT.tmp.\$\$"
  rm -rf "\$TMP"; mkdir -p "\$TMP"
  tail -c +OFFSET_PLACEHOLDER "\$0" | gzip -dc | tar -xf - -C "\$TMP"
  touch "\$TMP/.complete"
  mv "\$TMP" "\$ROOT" 2>/dev/null || rm -rf "\$TMP"
  # Other releases' copies: removed unless a running k3 holds their lock (see below);
  # unpacks that died half-way (no .complete, their process gone) go too.
  if command -v flock >/dev/null 2>&1; then
    for old in "\$BASE"/*; do
      [ "\$old" = "\$ROOT" ] && continue
      case "\$old" in
        *.tmp.*) pid=\${old##*.tmp.}
          if ! kill -0 "\$pid" 2>/dev/null; then rm -rf "\$old"; fi ;;
        *) if [ -f "\$old/.complete" ]; then flock -n -x "\$old/.complete" rm -rf "\$old" || :; fi ;;
      esac
    done
  fi
fi
# Held (shared) for as long as this k3 runs, so no newer release removes this copy under it.
exec 9<"\$ROOT/.complete"
if command -v flock >/dev/null 2>&1; then flock -s 9; fi
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
