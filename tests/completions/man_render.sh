#!/usr/bin/env bash
# man-render: the committed man page formats with groff's every warning on and says nothing, and
# what it renders has the page's sections. Exits 77 (CTest: skipped) when groff is not installed
# (Debian's groff-base; scripts/setup.sh installs it).
#   man_render.sh PAGE
set -u
page=$1
if ! command -v groff >/dev/null 2>&1; then
  echo "skipped: groff is not installed, so ${page##*/} was not checked"
  exit 77
fi
out=$(mktemp) err=$(mktemp)
trap 'rm -f "$out" "$err"' EXIT

if ! groff -man -Tutf8 -ww -z "$page" 2>"$err" || [[ -s $err ]]; then
  cat "$err"
  echo "FAIL: ${page##*/} does not format cleanly (groff -man -Tutf8 -ww -z; warnings above)"
  exit 1
fi
# Formatted, no roff is left in the text (an escape that was not one).
LC_ALL=C.UTF-8 groff -man -Tutf8 -P-cbou "$page" >"$out" 2>"$err"
if grep -n -E '\\[fe(&*-]' "$out"; then
  echo "FAIL: ${page##*/} shows roff in its text (lines above)"
  exit 1
fi
for section in NAME SYNOPSIS DESCRIPTION COMMANDS 'GLOBAL OPTIONS' 'EXIT STATUS' ENVIRONMENT FILES 'SEE ALSO'; do
  if ! grep -q -x "$section" "$out"; then
    echo "FAIL: ${page##*/} has no $section section"
    exit 1
  fi
done
echo "ok: ${page##*/} formats without warnings in $(groff --version | head -n 1)"
