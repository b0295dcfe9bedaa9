#!/usr/bin/env bash
# Hygiene that tools enforce (scripts/test.sh runs it; CI with it):
#   clang-format (.clang-format) over every C and C++ file of core/, cli/, include/ and tests/:
#     a file that is not formatted fails, with the diff (fix: clang-format -i FILE);
#   ShellCheck (warnings and errors) over the shell scripts of scripts/, .ci/ and tests/;
#   flake8's pyflakes checks (unused names, undefined names, ...) over python/ and tests/;
#   clang-tidy (.clang-tidy) over the C++ sources of core/ and cli/ changed since CUPOOL_TIDY_BASE
#     (default: the merge base with the upstream branch where there is one ahead of it, else the
#     commit before HEAD), with BUILD_DIR's compile commands; any finding fails.
# Usage: scripts/lint.sh [--all] [BUILD_DIR]   --all: clang-tidy over every source (minutes)
set -euo pipefail
cd "$(dirname "$0")/.."

all=0
if [ "${1:-}" = "--all" ]; then
  all=1
  shift
fi
BUILD=${1:-build}
FORMAT=${CLANG_FORMAT:-clang-format}
TIDY=${CLANG_TIDY:-clang-tidy}
status=0

# ---- clang-format ----
mapfile -t sources < <(git ls-files 'core/*.cpp' 'core/*.h' 'core/*.c' 'cli/*.cpp' 'cli/*.h' 'include/*.h' \
  'tests/*.cpp' 'tests/*.h' 'tests/*.c')
if ! command -v "$FORMAT" >/dev/null; then
  echo "lint: $FORMAT not found (Debian: clang-format; scripts/setup.sh installs it)" >&2
  exit 1
fi
unformatted=0
for f in "${sources[@]}"; do
  if ! "$FORMAT" --dry-run -Werror "$f" >/dev/null 2>&1; then
    unformatted=$((unformatted + 1))
    echo "lint: $f is not formatted (clang-format -i $f):"
    "$FORMAT" "$f" | diff -u "$f" - | head -30 | sed 's/^/  /' || true
  fi
done
echo "lint: clang-format: ${#sources[@]} files, $unformatted not formatted"
[ "$unformatted" -eq 0 ] || status=1

# ---- shellcheck and flake8 (Debian's packages; scripts/setup.sh installs them) ----
for tool in shellcheck flake8; do
  command -v "$tool" >/dev/null || { echo "lint: $tool not found (Debian: $tool; scripts/setup.sh installs it)" >&2; exit 1; }
done
mapfile -t shells < <(git ls-files 'scripts/*.sh' '.ci/run' 'tests/*.sh')
if shellcheck -S warning "${shells[@]}"; then
  echo "lint: shellcheck: ${#shells[@]} scripts, no findings"
else
  status=1
fi
if flake8 --select=F python tests; then
  echo "lint: flake8 (pyflakes): python/ and tests/, no findings"
else
  status=1
fi

# ---- clang-tidy ----
if [ "$all" -eq 1 ]; then
  mapfile -t tidy < <(git ls-files 'core/*.cpp' 'cli/*.cpp')
else
  base=${CUPOOL_TIDY_BASE:-}
  if [ -z "$base" ]; then
    upstream=$(git rev-parse -q --verify '@{upstream}' 2>/dev/null || true)
    if [ -n "$upstream" ] && [ "$(git rev-parse HEAD)" != "$upstream" ]; then
      base=$(git merge-base HEAD "$upstream")
    else
      base=$(git rev-parse -q --verify HEAD~1 2>/dev/null || git hash-object -t tree /dev/null)
    fi
  fi
  # Changed since base, committed or not, and still there.
  mapfile -t tidy < <({ git diff --name-only "$base" -- 'core/*.cpp' 'cli/*.cpp'; \
    git ls-files --others --exclude-standard 'core/*.cpp' 'cli/*.cpp'; } | sort -u | while read -r f; do [ -f "$f" ] && echo "$f"; done)
fi
if [ ${#tidy[@]} -eq 0 ]; then
  echo "lint: clang-tidy: no C++ source of core/ or cli/ changed${base:+ since $(git rev-parse --short "$base" 2>/dev/null || echo "$base")}"
  exit $status
fi
if ! command -v "$TIDY" >/dev/null; then
  echo "lint: $TIDY not found (Debian: clang-tidy; scripts/setup.sh installs it)" >&2
  exit 1
fi
if [ ! -f "$BUILD/compile_commands.json" ]; then
  echo "lint: $BUILD/compile_commands.json is missing: configure $BUILD first (scripts/setup.sh)" >&2
  exit 1
fi
# A unity tree's database names the batch files (unity_N_cxx.cxx), not the sources: each source
# gets its batch's command, so clang-tidy sees it with the flags it is built with.
db=$(mktemp -d)
trap 'rm -rf "$db"' EXIT
python3 - "$BUILD/compile_commands.json" "$db/compile_commands.json" <<'EOF'
import json, os, re, sys
out = []
for c in json.load(open(sys.argv[1])):
    f = c["file"]
    if re.search(r"/Unity/unity_\d+_(cxx|c)\.(cxx|c)$", f) and os.path.exists(f):
        for line in open(f):
            m = re.match(r'#include "(.+)"', line.strip())
            if m:
                out.append(dict(c, file=m.group(1), command=c["command"].replace(f, m.group(1))))
    else:
        out.append(c)
json.dump(out, open(sys.argv[2], "w"))
EOF
echo "lint: clang-tidy over ${#tidy[@]} file(s): ${tidy[*]}"
printf '%s\n' "${tidy[@]}" | xargs -P "$(nproc)" -n 1 "$TIDY" -p "$db" --quiet --warnings-as-errors='*' \
  >"$db/tidy.log" 2>&1 || { status=1; }
grep -v -E '^[0-9]+ warnings? generated\.$|^Suppressed [0-9]+ warnings|^Use -header-filter|^Use -system-headers' "$db/tidy.log" || true
[ $status -eq 0 ] && echo "lint: clang-tidy: no findings"
exit $status
