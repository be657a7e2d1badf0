#!/usr/bin/env bash
# Runs a check on a fixture that breaks the check's rule on purpose, and passes only if the check
# fails and says why:
#
#   tests/tools/expect_failure.sh [--expect TEXT]... -- COMMAND [ARG...]
#
# Passes (exit 0) when COMMAND exits with a status other than 0 and 77 and its output (stdout and
# stderr together) contains every TEXT, a fixed string. Fails (exit 1) otherwise, showing the
# output and what was missing. Exits 77 when COMMAND does (its tool is not installed), so that
# CTest, told SKIP_RETURN_CODE 77, reports the test as skipped rather than passed.
set -uo pipefail

expected=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do
  case "$1" in
    --expect)
      [ $# -ge 2 ] || { echo "expect_failure: --expect needs a text" >&2; exit 2; }
      expected+=("$2")
      shift 2
      ;;
    *)
      echo "expect_failure: unknown argument $1; usage: --expect TEXT... -- COMMAND..." >&2
      exit 2
      ;;
  esac
done
[ $# -ge 2 ] || { echo "expect_failure: no command after --" >&2; exit 2; }
shift

output="$("$@" 2>&1)"
status=$?
printf '%s\n' "$output"
echo "expect_failure: the check exited with status $status"
if [ "$status" -eq 77 ]; then
  echo "expect_failure: skipped (the check's tool is missing)"
  exit 77
fi
if [ "$status" -eq 0 ]; then
  echo "expect_failure: FAILED: the check passed a fixture that breaks its rule"
  exit 1
fi
missing=0
for text in "${expected[@]}"; do
  if ! grep -qF -- "$text" <<<"$output"; then
    echo "expect_failure: FAILED: the output does not say: $text"
    missing=1
  fi
done
[ "$missing" -eq 0 ] && echo "expect_failure: the check failed as expected"
exit "$missing"
