#!/usr/bin/env bash
# `make test-pythons`: `make test-floors` (the core suites, every direct dependency at its floor)
# once per Python version setup.cfg's classifiers name, each in its own venv. An interpreter is
# python3.X on PATH, else pyenv's newest 3.X; a version this machine lacks is skipped and named,
# and the summary says which versions ran, so a green run never claims an untested version.
set -uo pipefail
cd "$(dirname "$0")/.."

versions=$(sed -n 's/^ *Programming Language :: Python :: \(3\.[0-9][0-9]*\)$/\1/p' setup.cfg)
pyenv_root=${PYENV_ROOT:-$HOME/.pyenv}
ran=() skipped=() failed=()
for version in $versions; do
    # pyenv's shims answer for versions that are not active, then fail: ask each candidate
    # for its own executable and keep the first that runs.
    interpreter=
    for candidate in "$(command -v "python$version" || true)" \
        $(ls -d "$pyenv_root"/versions/"$version".*/bin/python 2>/dev/null | sort -rV); do
        interpreter=$("$candidate" -c 'import sys, venv; print(sys.executable)' 2>/dev/null) && break
        interpreter=
    done
    if [ -z "$interpreter" ]; then
        echo "== Python $version: skipped, no python$version on PATH nor in $pyenv_root/versions"
        skipped+=("$version")
        continue
    fi
    echo "== Python $version: $interpreter ($("$interpreter" -V 2>&1))"
    if make --no-print-directory test-floors PY="$interpreter" FLOORS_VENV=".venv-floors-$version"; then
        ran+=("$version")
    else
        failed+=("$version")
    fi
done
echo "== floors passed on Python: ${ran[*]:-none}; failed: ${failed[*]:-none}; skipped (absent): ${skipped[*]:-none}"
[ ${#failed[@]} -eq 0 ] && [ ${#ran[@]} -gt 0 ]
