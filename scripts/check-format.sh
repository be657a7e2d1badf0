#!/usr/bin/env bash
# Fails when a C++ source file is not formatted as the checked-in .clang-format says.
#
#   scripts/check-format.sh [--root DIR]   every *.h / *.cc under src/ tests/ bench/ fuzz/ of DIR
#                                          (default: the checkout this script is in): the files git
#                                          tracks or would track (ignored ones left out) when DIR is
#                                          a git checkout, every such file found otherwise
#   scripts/check-format.sh FILE...        just these files (the tests check a fixture this way)
#
# Runs `clang-format --dry-run -Werror` (formats nothing), which prints every difference as
#   path:line:col: error: code should be clang-formatted [-Wclang-format-violations]
# then lists the files that differ. Exit status: 0 when every file is formatted, 1 when some is
# not (fix with `make format`), 2 for bad usage, 77 when clang-format is missing (CTest reports
# the test as skipped: scripts/install-deps.sh installs it). CLANG_FORMAT names another binary.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
files=()
while [ $# -gt 0 ]; do
  case "$1" in
    --root)
      [ $# -ge 2 ] || { echo "check-format: --root needs a directory" >&2; exit 2; }
      root="$(cd "$2" && pwd)"
      shift 2
      ;;
    -h | --help)
      sed -n '2,15p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
      exit 0
      ;;
    -*)
      echo "check-format: unknown option $1 (see --help)" >&2
      exit 2
      ;;
    *)
      files+=("$1")
      shift
      ;;
  esac
done

clang_format="${CLANG_FORMAT:-}"
if [ -z "$clang_format" ]; then
  for candidate in clang-format clang-format-14; do
    if command -v "$candidate" >/dev/null; then
      clang_format="$candidate"
      break
    fi
  done
fi
if [ -z "$clang_format" ] || ! command -v "$clang_format" >/dev/null; then
  echo "check-format: clang-format not found (scripts/install-deps.sh installs it); skipped" >&2
  exit 77
fi

if [ ${#files[@]} -eq 0 ]; then
  cd "$root"
  dirs=(src tests bench fuzz)
  if [ "$(git rev-parse --show-toplevel 2>/dev/null)" = "$root" ]; then
    pathspecs=()
    for d in "${dirs[@]}"; do pathspecs+=("$d/*.h" "$d/*.cc"); done
    # Tracked files plus new ones not yet added; a file deleted but not yet committed is skipped.
    while IFS= read -r f; do
      [ -f "$f" ] && files+=("$f")
    done < <(git ls-files --cached --others --exclude-standard -- "${pathspecs[@]}" | sort -u)
  else
    while IFS= read -r f; do
      files+=("$f")
    done < <(find "${dirs[@]}" -type f \( -name '*.h' -o -name '*.cc' \) 2>/dev/null | sort)
  fi
  if [ ${#files[@]} -eq 0 ]; then
    echo "check-format: no *.h or *.cc files under ${dirs[*]} of $root" >&2
    exit 2
  fi
fi

# One clang-format per core, a batch of files each; the diagnostics name the files.
jobs="$(nproc 2>/dev/null || echo 2)"
output="$(printf '%s\0' "${files[@]}" |
  xargs -0 -n 16 -P "$jobs" "$clang_format" --dry-run -Werror 2>&1)" && status=0 || status=$?
if [ "$status" -eq 0 ] && [ -z "$output" ]; then
  echo "check-format: ${#files[@]} files formatted as .clang-format says"
  exit 0
fi
printf '%s\n' "$output"
differing="$(printf '%s\n' "$output" |
  sed -n 's/^\(.*\):[0-9]*:[0-9]*: error: code should be clang-formatted.*/\1/p' | sort -u)"
if [ -z "$differing" ]; then  # clang-format failed for another reason (unreadable file, bad style)
  echo "check-format: $clang_format failed (status $status)" >&2
  exit 1
fi
echo
echo "check-format: $(printf '%s\n' "$differing" | wc -l) of ${#files[@]} files differ from" \
  ".clang-format; run \`make format\`:"
printf '%s\n' "$differing" | sed 's/^/  /'
exit 1
