#!/usr/bin/env bash
# Creates (or refreshes) ./.venv with the Python test dependencies of
# tests/python/requirements.txt (the published phrony SDK, grpcio, pytest, ...).
#
# Idempotent and fast when nothing changed: the sha256 of the requirements file
# (and of this script) is stamped into the venv after a successful install, and
# a matching stamp skips pip entirely.
#
# Usage: .ci/python-venv.sh          (from anywhere inside the repository)
# Env:   PYTHON  interpreter used to create the venv (default: python3)
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="$repo_root/.venv"
requirements="$repo_root/tests/python/requirements.txt"
stamp="$venv/.phrony-requirements.sha256"
python="${PYTHON:-python3}"

want="$(cat "$requirements" "${BASH_SOURCE[0]}" | sha256sum | cut -d' ' -f1)"

if [[ -x "$venv/bin/python" ]] && "$venv/bin/python" -c 'import sys' 2>/dev/null \
    && [[ -f "$stamp" ]] && [[ "$(cat "$stamp")" == "$want" ]]; then
    exit 0
fi

if ! [[ -x "$venv/bin/python" ]] || ! "$venv/bin/python" -c 'import sys' 2>/dev/null; then
    # Missing or broken (e.g. the base interpreter was removed): start over.
    rm -rf "$venv"
    "$python" -m venv "$venv"
fi

rm -f "$stamp"
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check -r "$requirements"
printf '%s\n' "$want" > "$stamp"
echo "python-venv: $venv ready ($(wc -l < "$requirements" | tr -d ' ') requirement lines)" >&2
