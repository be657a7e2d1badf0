#!/usr/bin/env bash
# The thread-safety check: compiles sluice's annotated translation units with clang's thread-safety
# analysis turned into errors, so that a broken lock rule (GUARDED_BY, REQUIRES, ...: see
# src/sluice/core/thread_annotations.h) fails `make test` even where the build itself uses g++.
#
#   tests/tools/check_thread_safety.sh CLANGXX [--root DIR] [FLAG...] [-- FILE...]
#
#   CLANGXX  the clang++ to run (tests/tools/CMakeLists.txt finds it).
#   DIR      the checkout (default: the one this script is in); DIR/src is on the include path.
#   FLAG...  further compiler flags: the include directories of the dependencies, as the real build
#            has them (fmt, nlohmann_json, OpenBLAS, MPI; tests/tools/CMakeLists.txt passes them).
#   FILE...  the files to check. Default: every DIR/src/sluice/**/*.cc that includes
#            sluice/core/mutex.h or sluice/core/thread_annotations.h, itself or through the header
#            of the same name beside it — every translation unit that defines annotated state.
#
# Each file gets `CLANGXX -std=c++20 -fsyntax-only -Wthread-safety -Wthread-safety-beta` with both
# made errors (nothing is built). Exit status: 0 when no file breaks a rule, 1 when some does (the
# diagnostics say file:line:col and which lock is missing), 2 for bad usage, 77 when CLANGXX is
# not installed (CTest reports the test as skipped: scripts/install-deps.sh installs clang).
set -euo pipefail

[ $# -ge 1 ] || { echo "check_thread_safety: usage: CLANGXX [--root DIR] [FLAG...] [-- FILE...]" >&2; exit 2; }
clangxx="$1"
shift
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
if [ "${1:-}" = "--root" ]; then
  [ $# -ge 2 ] || { echo "check_thread_safety: --root needs a directory" >&2; exit 2; }
  root="$(cd "$2" && pwd)"
  shift 2
fi
flags=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do
  flags+=("$1")
  shift
done
[ $# -gt 0 ] && shift  # the "--"
files=("$@")

if ! command -v "$clangxx" >/dev/null; then
  echo "check_thread_safety: clang++ not found (scripts/install-deps.sh installs clang); skipped" >&2
  exit 77
fi

uses_annotations() {
  grep -qE '#include "sluice/core/(mutex|thread_annotations)\.h"' "$@" 2>/dev/null
}
if [ ${#files[@]} -eq 0 ]; then
  while IFS= read -r cc; do
    header="${cc%.cc}.h"
    if uses_annotations "$cc" || { [ -f "$header" ] && uses_annotations "$header"; }; then
      files+=("$cc")
    fi
  done < <(find "$root/src/sluice" -name '*.cc' | sort)
  if [ ${#files[@]} -eq 0 ]; then
    echo "check_thread_safety: no annotated translation unit under $root/src/sluice" >&2
    exit 2
  fi
fi

# One clang per core; -fsyntax-only runs the analysis without generating code.
jobs="$(nproc 2>/dev/null || echo 2)"
if printf '%s\0' "${files[@]}" |
  xargs -0 -n 1 -P "$jobs" "$clangxx" -std=c++20 -fsyntax-only -Wthread-safety \
    -Wthread-safety-beta -Werror=thread-safety -Werror=thread-safety-beta -I"$root/src" \
    "${flags[@]}"; then
  echo "check_thread_safety: ${#files[@]} translation units keep their lock rules:"
  printf '  %s\n' "${files[@]#"$root"/}"
  exit 0
fi
echo "check_thread_safety: a lock rule is broken (see the errors above; core/thread_annotations.h" \
  "says what each annotation requires)" >&2
exit 1
