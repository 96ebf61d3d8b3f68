#!/usr/bin/env bash
# Every GPU path of hvd_magic on a single-GPU machine: see scripts/gpu_check/__main__.py and
# docs/gpu.md. PYTHON chooses the interpreter (default: python3, the one that holds CUDA PyTorch).
exec "${PYTHON:-python3}" "$(dirname "${BASH_SOURCE[0]}")/gpu_check" "$@"
