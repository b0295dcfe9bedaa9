#!/usr/bin/env bash
# Rewrites the committed shell completions (completions/) and the man page (docs/man/cupool.1) from a
# built cupool, which generates them from its own command-line definition ('cupool completion SHELL',
# 'cupool completion man'). Run it after changing any verb or option; the completions-drift test
# fails until you do.
#
#   scripts/regen-completions.sh BUILD_DIR      # e.g. scripts/regen-completions.sh build
set -euo pipefail

if [[ $# -ne 1 || $1 == -h || $1 == --help ]]; then
  echo "usage: $0 BUILD_DIR   (the build directory that holds the cupool binary)" >&2
  exit 2
fi
bin=$1/cupool
if [[ ! -x $bin ]]; then
  echo "$0: no cupool binary at $bin: build first (cmake --build $1)" >&2
  exit 2
fi
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
mkdir -p "$root/completions" "$root/docs/man"

tmp=''
trap 'rm -f "$tmp"' EXIT

# shell:file pairs, as installed by CMakeLists.txt.
for pair in bash:completions/cupool.bash zsh:completions/_cupool fish:completions/cupool.fish man:docs/man/cupool.1; do
  shell=${pair%%:*} file=$root/${pair#*:}
  tmp=$(mktemp "$file.XXXXXX")
  if ! "$bin" completion "$shell" >"$tmp"; then
    echo "$0: '$bin completion $shell' failed" >&2
    exit 1
  fi
  if cmp -s "$tmp" "$file"; then
    rm -f "$tmp"
    tmp=''
    echo "unchanged  ${pair#*:}"
  else
    chmod 644 "$tmp"
    mv "$tmp" "$file"
    tmp=''
    echo "rewritten  ${pair#*:}"
  fi
done
