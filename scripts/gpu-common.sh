# shellcheck shell=bash disable=SC2034  # sourced: the scripts that source it use what it sets
# Sourced by the scripts that run on a GPU machine (exec-proof.sh, exec-fork-proof.sh) with the
# build directory as $1: sets BUILD, OUT (created), here (the repository), tmp (a scratch
# directory) and puts the driver's directory on LD_LIBRARY_PATH.
BUILD=${1:-build-gpu}
OUT=${OUT:-./gpu-out}
mkdir -p "$OUT"
export LD_LIBRARY_PATH=/usr/local/nvidia/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
tmp=$(mktemp -d)
