#!/bin/sh
# Runs the test suite (the command in "$@") with a $TMPDIR of its own, then fails if any test
# left anything in it (tests clean up after themselves), listing what.
# Fixtures too costly to make per test file (tests/support/shared_fixtures.ts) are made once
# in a folder of the run's own, K3_TEST_FIXTURES, outside that $TMPDIR; it goes with the run.
base=${TMPDIR:-/tmp}
tmp=$(mktemp -d "$base/k3-make-test-XXXXXX") || exit 1
fixtures=$(mktemp -d "$base/k3-test-fixtures-XXXXXX") || exit 1
trap 'rm -rf "$tmp" "$fixtures"' EXIT
trap 'exit 130' INT TERM
TMPDIR=$tmp K3_TEST_FIXTURES=$fixtures "$@"
rc=$?
if [ -n "$(ls -A "$tmp")" ]; then
  echo "FAILED: the tests left these in \$TMPDIR ($tmp); each test must remove what it makes:"
  ls -lA "$tmp"
  [ "$rc" -ne 0 ] || rc=1
fi
exit "$rc"
