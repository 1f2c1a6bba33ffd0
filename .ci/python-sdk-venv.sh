#!/usr/bin/env bash
# Creates (or refreshes) ./.venv-sdk for the tests of our own Python SDK (sdks/python/tests):
# `pip install ./sdks/python` (phrony 0.2.0), its test requirements (sdks/python/requirements-dev.txt),
# and the published phrony 0.1.0 unpacked into .venv-sdk/phrony-0.1.0 (not importable by default;
# test_api_surface.py puts it on PYTHONPATH of a subprocess to compare the two APIs).
# ./.venv (the published SDK's contract tests, .ci/python-venv.sh) is not touched.
#
# Idempotent: the SDK is reinstalled on every run (its sources change); the requirements are
# installed again only when requirements-dev.txt or this script changed (sha256 stamp).
#
# Usage: .ci/python-sdk-venv.sh      Env: PYTHON  interpreter for the venv (default: python3)
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="$repo_root/.venv-sdk"
sdk="$repo_root/sdks/python"
requirements="$sdk/requirements-dev.txt"
stamp="$venv/.phrony-sdk-requirements.sha256"
published="$venv/phrony-0.1.0"
python="${PYTHON:-python3}"

want="$(cat "$requirements" "${BASH_SOURCE[0]}" | sha256sum | cut -d' ' -f1)"

if ! [[ -x "$venv/bin/python" ]] || ! "$venv/bin/python" -c 'import sys' 2>/dev/null; then
    rm -rf "$venv"
    "$python" -m venv "$venv"
fi

pip=("$venv/bin/python" -m pip --quiet --disable-pip-version-check)
if ! [[ -f "$stamp" ]] || [[ "$(cat "$stamp")" != "$want" ]]; then
    rm -f "$stamp"
    "${pip[@]}" install -r "$requirements"
    rm -rf "$published"
    "${pip[@]}" install --no-deps --target "$published" phrony==0.1.0
    printf '%s\n' "$want" > "$stamp"
fi
# Not editable: the tests run against the installed distribution, as a user gets it.
"${pip[@]}" install --no-deps --force-reinstall "$sdk"
echo "python-sdk-venv: $venv ready (phrony $("$venv/bin/python" -c 'import phrony; print(phrony.SDK_VERSION)'))" >&2
