# Sourced by .ci/vllm_venv.sh and .ci/verl_venv.sh: one environment built from a requirement list, or reused.
#
# cached_venv NAME VENV STAMP_TEXT NO_DEPS CHECK  (REQUIREMENTS, REMOVE and PYTHON set by the caller)
# Builds VENV when it is missing or STAMP_TEXT changed (a hash of it is kept inside): REQUIREMENTS, then NO_DEPS
# with --no-deps, REMOVE uninstalled, this clone editable, CHECK run by its python (fails loudly now, not in a test).
# Reuses it otherwise. Either way tracklane points at this clone's folders; prints VENV's path, the only stdout.
cached_venv() {
  local name="$1" venv="$2" stamp_text="$3" no_deps="$4" check="$5" stamp
  stamp="$(printf '%s' "$stamp_text" | sha256sum | cut -d' ' -f1)"
  if [ -x "$venv/bin/python" ] && [ "$(cat "$venv/.tracklane-requirements.sha256" 2>/dev/null)" = "$stamp" ]; then
    echo "$name venv $venv is up to date" >&2
  else
    echo "building the $name venv in $venv (requirements changed or missing)" >&2
    rm -rf "$venv"
    mkdir -p "$(dirname "$venv")"
    "$PYTHON" -m venv "$venv"
    "$venv/bin/python" -m pip install -q --upgrade pip >&2
    printf '%s\n' "$REQUIREMENTS" > "$venv/requirements.txt"
    "$venv/bin/python" -m pip install -q -r "$venv/requirements.txt" >&2
    # shellcheck disable=SC2086  # one word per package
    if [ -n "$no_deps" ]; then "$venv/bin/python" -m pip install -q --no-deps $no_deps >&2; fi
    # shellcheck disable=SC2086
    "$venv/bin/python" -m pip uninstall -q -y $REMOVE >&2
    "$venv/bin/python" -m pip install -q --no-deps -e . >&2  # this clone, as tracklane
    "$venv/bin/python" -c "$check" >&2
    printf '%s\n' "$stamp_text" > "$venv/requirements.stamp.txt"
    printf '%s\n' "$stamp" > "$venv/.tracklane-requirements.sha256"
  fi
  # tracklane from this clone's folders (a venv built for another clone, kept outside it by .ci/run, points there)
  if ! "$venv/bin/python" -c "import os, sys, tracklane
sys.exit(os.path.realpath(tracklane.__file__) != os.path.realpath('pipeline/__init__.py'))" 2>/dev/null; then
    "$venv/bin/python" -m pip install -q --no-deps -e . >&2
  fi
  cd "$venv" && pwd
}
