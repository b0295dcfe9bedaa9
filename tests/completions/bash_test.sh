#!/usr/bin/env bash
# completions-bash: source completions/cupool.bash and drive its completion function the way bash's
# programmable completion does (COMP_WORDS, COMP_CWORD, COMP_LINE, COMP_POINT), then check COMPREPLY.
#   bash_test.sh path/to/cupool.bash
set -u
script=${1:?usage: bash_test.sh path/to/cupool.bash}

# shellcheck source=/dev/null
if ! source "$script"; then
  echo "FAIL: sourcing $script failed"
  exit 1
fi

passed=0 failed=0
ok() { echo "ok - $1"; passed=$((passed + 1)); }
fail() { echo "FAIL - $1"; failed=$((failed + 1)); }

if [[ $(complete -p cupool 2>/dev/null) == *"-F _cupool"* ]]; then
  ok "the script registers _cupool for cupool"
else
  fail "the script registers _cupool for cupool (complete -p: $(complete -p cupool 2>&1))"
fi

# Completes LINE with the cursor at its end: splits it into COMP_WORDS as bash does (at blanks, and
# '=' as a word of its own, as COMP_WORDBREAKS has it), runs _cupool, leaves the matches in GOT
# (sorted, one line).
GOT=''
complete_line() {
  local line=$1 word
  local -a words=()
  read -ra words <<<"$line"
  COMP_WORDS=()
  for word in "${words[@]}"; do
    if [[ $word == -*=* ]]; then
      COMP_WORDS+=("${word%%=*}" "=")
      [[ -n ${word#*=} ]] && COMP_WORDS+=("${word#*=}")
    else
      COMP_WORDS+=("$word")
    fi
  done
  [[ $line == *' ' ]] && COMP_WORDS+=('')
  COMP_CWORD=$((${#COMP_WORDS[@]} - 1))
  COMP_LINE=$line
  COMP_POINT=${#line}
  COMPREPLY=()
  _cupool cupool "${COMP_WORDS[COMP_CWORD]}" "${COMP_WORDS[COMP_CWORD - 1]}"
  GOT=$(printf '%s\n' "${COMPREPLY[@]}" | sed '/^$/d' | LC_ALL=C sort | tr '\n' ' ')
  GOT=${GOT% }
}

sorted() { printf '%s\n' "$@" | LC_ALL=C sort | tr '\n' ' ' | sed 's/ $//'; }

# expect_exactly LINE WORD...: the matches are exactly these.
expect_exactly() {
  local line=$1
  shift
  complete_line "$line"
  local want
  want=$(sorted "$@")
  if [[ $GOT == "$want" ]]; then ok "'$line' -> $want"; else fail "'$line' -> want '$want', got '$GOT'"; fi
}

# expect_has LINE WORD... [-- UNWANTED...]: the matches include the words and none of the unwanted.
expect_has() {
  local line=$1 w bad=''
  shift
  complete_line "$line"
  local -a matches
  read -ra matches <<<"$GOT"
  local unwanted=0
  for w in "$@"; do
    if [[ $w == -- ]]; then
      unwanted=1
      continue
    fi
    local found=0 m
    for m in "${matches[@]}"; do [[ $m == "$w" ]] && found=1; done
    if ((found == unwanted)); then bad+=" $( ((unwanted)) && echo "unwanted" || echo "missing") $w;"; fi
  done
  local said="offers $*"
  said=${said/ -- /, not }
  if [[ -z $bad ]]; then ok "'$line' $said"; else fail "'$line':$bad got '$GOT'"; fi
}

# Run in a scratch directory with known files in it.
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
cd "$scratch" || exit 1
mkdir configs
touch pools.yaml node.yml notes.txt

# Verbs.
expect_exactly "cupool qu" query
expect_has "cupool " query check completion
expect_exactly "cupool --log-level debug qu" query

# Options, global and per verb.
expect_has "cupool --" --help --version --log-level -- --format
expect_exactly "cupool query --fo" --format
expect_exactly "cupool check pools.yaml --st" --strict
expect_exactly "cupool query --devices 0 --de" --deep --devices
expect_has "cupool query " --format --deep

# Fixed choices (CLI::IsMember).
expect_exactly "cupool query --format " table json yaml nfd
expect_exactly "cupool query --format=" table json yaml nfd
expect_exactly "cupool query --format=j" json
expect_exactly "cupool check -o y" yaml
expect_exactly "cupool --log-level " trace debug info warn error off
expect_exactly "cupool completion " bash zsh fish man

# File names: configs and profiles prefer YAML, outputs take any file.
expect_has "cupool check " pools.yaml node.yml configs -- notes.txt query
expect_has "cupool check --profile " pools.yaml node.yml configs -- notes.txt
expect_has "cupool query --profile-out " pools.yaml notes.txt configs
expect_exactly "cupool check no" node.yml
expect_exactly "cupool check not" notes.txt # no YAML file matches: any file

echo "$passed passed, $failed failed"
((failed == 0))
