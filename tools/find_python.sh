# Sourced by tools/dist_train.sh and tools/dist_test.sh: sets PYTHON, the
# interpreter. $PYTHON if set; else the active virtual environment's or
# conda's python; else this repository's .venv (made by `make`); else python.
if [ -z "${PYTHON:-}" ]; then
  ROOT_VENV="$(dirname "$0")/../.venv/bin/python"
  if [ -n "${VIRTUAL_ENV:-}${CONDA_PREFIX:-}" ]; then
    PYTHON=python
  elif [ -x "$ROOT_VENV" ]; then
    PYTHON="$ROOT_VENV"
  else
    PYTHON=python
  fi
fi
