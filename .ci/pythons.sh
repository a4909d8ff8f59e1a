#!/usr/bin/env bash
# `make test-pythons`: `make test-floors` (the core suites, every direct dependency at its floor)
# once per Python version setup.cfg's classifiers name, each in its own venv. An interpreter is
# python3.X on PATH, else pyenv's newest 3.X; a version this machine lacks is skipped and named,
# and the summary says which versions ran, so a green run never claims an untested version.
# Then the whole suite, newest dependencies, on the oldest and the newest of those versions (not
# on the one `make test` ran on): the core suites alone missed what differs between Pythons
# (3.13's reading of IPv4-mapped addresses and its json nesting limit, cronsim for 3.10).
set -uo pipefail
cd "$(dirname "$0")/.."

versions=$(sed -n 's/^ *Programming Language :: Python :: \(3\.[0-9][0-9]*\)$/\1/p' setup.cfg)
pyenv_root=${PYENV_ROOT:-$HOME/.pyenv}
ran=() skipped=() failed=() found=() interpreters=()
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
    found+=("$version") interpreters+=("$interpreter")
    if make --no-print-directory test-floors PY="$interpreter" FLOORS_VENV=".venv-floors-$version"; then
        ran+=("$version")
    else
        failed+=("$version")
    fi
done
echo "== floors passed on Python: ${ran[*]:-none}; failed: ${failed[*]:-none}; skipped (absent): ${skipped[*]:-none}"

main=$("${PY:-python3}" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
whole_ran=() whole_failed=()
last=$(( ${#found[@]} - 1 ))
for i in $( [ "$last" -ge 0 ] && printf '%s\n' 0 "$last" | sort -un ); do
    version=${found[$i]} interpreter=${interpreters[$i]}
    if [ "$version" = "$main" ]; then
        echo "== whole suite on Python $version: \`make test\` ran it"
        continue
    fi
    venv=".venv-$version"
    echo "== whole suite on Python $version, newest dependencies ($venv)"
    if { test -x "$venv/bin/python" || "$interpreter" -m venv "$venv"; } \
        && "$venv/bin/python" -m pip install --quiet --disable-pip-version-check -e '.[dev]' \
        && "$venv/bin/pytest" -q -p no:cacheprovider -n "${TEST_JOBS:-3}" --dist loadfile \
            --no-loadscope-reorder; then
        whole_ran+=("$version")
    else
        whole_failed+=("$version")
    fi
done
echo "== whole suite passed on Python: ${whole_ran[*]:-none}; failed: ${whole_failed[*]:-none}"
[ ${#failed[@]} -eq 0 ] && [ ${#ran[@]} -gt 0 ] && [ ${#whole_failed[@]} -eq 0 ]
