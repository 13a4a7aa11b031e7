#!/usr/bin/env bash
# Checks that every C++ file (outside third_party/) is formatted as .clang-format says,
# naming each that is not; the fix is `clang-format -i FILE`.
#   bash tools/check_format.sh
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# (version 14, as applied: another version formats some constructs otherwise)
CLANG_FORMAT="${CLANG_FORMAT:-clang-format-14}"
command -v "$CLANG_FORMAT" >/dev/null || { echo "check_format: $CLANG_FORMAT not installed (apt-get install clang-format-14)"; exit 1; }
bad=0
while IFS= read -r f; do
  if ! "$CLANG_FORMAT" --dry-run -Werror "$f" >/dev/null 2>&1; then
    echo "check_format: $f is not formatted ($CLANG_FORMAT -i $f)" >&2
    bad=$((bad + 1))
  fi
done < <(git ls-files '*.cc' '*.h' '*.cu' | grep -v '^third_party/')
if ((bad > 0)); then echo "check_format: $bad file(s) not formatted" >&2; exit 1; fi
echo "check_format: every C++ file formatted"
