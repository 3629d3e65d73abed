#!/bin/sh
# Runs the test suite (the command in "$@") with a $TMPDIR of its own, then fails if any test
# left anything in it (tests clean up after themselves), listing what.
base=${TMPDIR:-/tmp}
tmp=$(mktemp -d "$base/k3-make-test-XXXXXX") || exit 1
TMPDIR=$tmp "$@"
rc=$?
if [ -n "$(ls -A "$tmp")" ]; then
  echo "FAILED: the tests left these in \$TMPDIR ($tmp); each test must remove what it makes:"
  ls -lA "$tmp"
  [ "$rc" -ne 0 ] || rc=1
fi
rm -rf "$tmp"
exit "$rc"
