#!/bin/sh
# The test files in two parts, then one summary line for both (.ci/run reads it):
# - most files two at a time (deno test --parallel, DENO_JOBS=2): many of them spend their
#   time in one thread (qemu, wine, gzip, a child process's start) or waiting on a child;
# - then, one file at a time, the files whose assertions measure time (a /health p99 during a
#   pass, Ctrl-C answered within seconds, a terminal's screen, retries and time limits), which
#   a second test file beside them could make late.
# Two files at a time, not one per core: the full-size runs hold up to 10 GB each.
# Usage: sh scripts/test-suite.sh DENO
deno=$1
alone="tests/serve tests/chat tests/hub tests/api/library_cancel.test.ts
  tests/memory/full.test.ts tests/memory/loading_experts.test.ts tests/cli/fuzz.test.ts
  tests/cli/flags_abuse.test.ts tests/model/state.test.ts tests/text/tokenizer.test.ts
  tests/layout/pack.test.ts"
log=$(mktemp) || exit 1
trap 'rm -f "$log"' EXIT
# deno test's last line: "ok | N passed (M steps) | F failed" or "FAILED | ...", colours off.
summary() { sed 's/\x1b\[[0-9;]*m//g' "$log" | grep -E '^(ok|FAILED) \| [0-9]+ passed' | tail -n 1; }
DENO_JOBS=2 "$deno" test --no-check -A --parallel --ignore="$(echo $alone | tr ' ' ',')" tests/ \
  2>&1 | tee "$log"
together=$(summary)
# shellcheck disable=SC2086
"$deno" test --no-check -A $alone 2>&1 | tee "$log"
apart=$(summary)
count() { printf '%s' "$1" | sed -nE "s/.*\| ([0-9]+) $2.*/\1/p"; }
if [ -z "$together" ] || [ -z "$apart" ]; then
  echo "FAILED | $(($(count "$together" passed) + $(count "$apart" passed) + 0)) passed | 1 failed" \
    "(a part ended without its summary)"
  exit 1
fi
passed=$(($(count "$together" passed) + $(count "$apart" passed)))
failed=$(($(count "$together" failed) + $(count "$apart" failed)))
if [ "$failed" -ne 0 ]; then
  echo "FAILED | $passed passed | $failed failed (both parts)"
  exit 1
fi
echo "ok | $passed passed | 0 failed (both parts: two files at a time, then timed ones alone)"
