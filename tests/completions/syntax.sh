#!/usr/bin/env bash
# completions-zsh / completions-fish: the script parses in its shell (SHELL -n). Exits 77 (CTest:
# skipped) when that shell is not installed.
#   syntax.sh SHELL SCRIPT
set -u
shell=$1 script=$2
if ! command -v "$shell" >/dev/null 2>&1; then
  echo "skipped: $shell is not installed, so ${script##*/} was not syntax-checked"
  exit 77
fi
if "$shell" -n "$script"; then
  echo "ok: ${script##*/} parses in $("$shell" --version 2>&1 | head -n 1)"
else
  echo "FAIL: ${script##*/} does not parse in $shell"
  exit 1
fi
