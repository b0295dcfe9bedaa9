#!/usr/bin/env bash
# completions-drift: the committed completions/ and docs/man/cupool.1 are exactly what
# 'cupool completion SHELL' and 'cupool completion man' print.
#   drift.sh CUPOOL_BINARY SOURCE_DIR
set -u
bin=$1 root=$2
tmp=$(mktemp)
trap 'rm -f "$tmp"' EXIT

stale=0
for pair in bash:completions/cupool.bash zsh:completions/_cupool fish:completions/cupool.fish man:docs/man/cupool.1; do
  shell=${pair%%:*} file=${pair#*:}
  if ! "$bin" completion "$shell" >"$tmp"; then
    echo "FAIL: '$bin completion $shell' failed"
    exit 1
  fi
  if [[ ! -f $root/$file ]]; then
    echo "FAIL: $file is missing"
    stale=1
  elif diff -u --label "$file (committed)" --label "cupool completion $shell (generated)" "$root/$file" "$tmp"; then
    echo "ok: $file is up to date"
  else
    echo "FAIL: $file is out of date with the command line (diff above)"
    stale=1
  fi
done

if ((stale)); then
  echo "Run scripts/regen-completions.sh BUILD_DIR and commit completions/ and docs/man/."
  exit 1
fi
