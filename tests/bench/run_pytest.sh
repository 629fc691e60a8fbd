#!/bin/sh
# Runs a pytest file of tests/bench with the venv's python: $KILN_PYTHON (scripts/test.sh
# exports it), else ~/.cache/kiln/venv/bin/python. A missing venv is a failure, not a skip.
PY="${KILN_PYTHON:-$HOME/.cache/kiln/venv/bin/python}"
if [ ! -x "$PY" ]; then
  echo "bench tests: no Python venv at $PY: run scripts/setup_python.sh (or set KILN_PYTHON)" >&2
  exit 1
fi
exec "$PY" -m pytest -q -p no:cacheprovider "$@"
