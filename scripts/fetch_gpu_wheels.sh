#!/usr/bin/env bash
# For a GPU machine without network that already has torch, triton, numpy, pandas, matplotlib, scipy and
# pytest (as the H200 images do): download, on a machine with network, the wheels `make gpu-check` needs
# besides (nbclient, nbformat, ipykernel, ipywidgets and what they pull in) into .whl/ (kept out of git).
#   scripts/fetch_gpu_wheels.sh [EXTRA_PACKAGE ...]      # PYVER=3.12 by default: the GPU machine's Python
# Then copy .whl/ beside the checkout on the GPU machine and, from the checkout:
#   python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
#   PYTHONPATH=/tmp/site:$PWD make gpu-check PYTHON=python3
set -euo pipefail
cd "$(dirname "$0")/.."
PYVER=${PYVER:-3.12}
mkdir -p .whl
python3 -m pip download -q --only-binary=:all: --python-version "$PYVER" --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  --platform any -d .whl nbclient nbformat ipykernel ipywidgets jsonschema pyyaml "$@"
# The machine's own copies of these stay in charge: a second, different copy on PYTHONPATH would shadow them.
for have in torch triton numpy pandas matplotlib scipy pytest pluggy iniconfig packaging typing_extensions \
            nvidia_*; do
  rm -f .whl/"$have"-[0-9]*.whl
done
du -sh .whl
