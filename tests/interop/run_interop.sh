#!/bin/sh
# Runs one PyTorch interop test in a fresh directory:
#   run_interop.sh frugal_to_torch|torch_to_frugal INTEROP_GPT_EXE SCRIPT_DIR WORK_DIR
# Exits 77 (skipped) when no python3 with torch and numpy is installed.
# $FRUGAL_PYTHON picks the interpreter; otherwise the first of python3 on
# the PATH and /usr/bin/python3 (Debian's python3-torch) that has torch.
set -e
direction=$1 exe=$2 scripts=$3 work=$4
py=
for candidate in ${FRUGAL_PYTHON:-} python3 /usr/bin/python3; do
  if "$candidate" -c "import torch, numpy" >/dev/null 2>&1; then py=$candidate; break; fi
done
if [ -z "$py" ]; then
  echo "no python3 with torch and numpy: skipping"
  exit 77
fi
rm -rf "$work"
mkdir -p "$work"
case $direction in
  frugal_to_torch)
    "$exe" export "$work"
    "$py" "$scripts/torch_interop.py" check "$work" ;;
  torch_to_frugal)
    "$py" "$scripts/torch_interop.py" export "$work"
    "$exe" import "$work" ;;
  *) echo "unknown direction $direction"; exit 2 ;;
esac
