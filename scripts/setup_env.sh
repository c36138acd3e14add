#!/usr/bin/env bash
# Builds the project's environment; every step is skipped when already done.
#   VENV         where the virtual environment lives (default: .venv)
#   BASE_PYTHON  the Python that creates it (default: python3)
#   SYSTEM_SITE  1 = let the venv see BASE_PYTHON's packages, e.g. its torch
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
BASE_PYTHON=${BASE_PYTHON:-python3}
if [ ! -x "$VENV/bin/python" ]; then
  if [ "${SYSTEM_SITE:-0}" = 1 ]; then
    "$BASE_PYTHON" -m venv --system-site-packages "$VENV"
  else
    "$BASE_PYTHON" -m venv "$VENV"
  fi
fi
PY="$VENV/bin/python"
PIP="$PY -m pip --disable-pip-version-check -q"
has() { "$PY" -c "$1" >/dev/null 2>&1; }

# torch: the one in the environment if there is one, else the pinned CPU build.
# (torch asks for setuptools>=77 while mmengine needs pkg_resources from
# setuptools<70, so torch goes in first, unconstrained.)
has 'import torch' || $PIP install -r requirements/torch.txt

# Every later pip call holds the pins in requirements/constraints.txt; a torch
# the user pointed us at (another version) is kept rather than replaced.
TORCH_VERSION=$("$PY" -c 'import torch; print(torch.__version__.split("+")[0])')
if [ "$TORCH_VERSION" = "$(sed -n 's/^torch==//p' requirements/torch.txt)" ]; then
  export PIP_CONSTRAINT="$PWD/requirements/constraints.txt"
else
  sed '/^torch==/d' requirements/constraints.txt > "$VENV/constraints.txt"
  export PIP_CONSTRAINT="$PWD/$VENV/constraints.txt"
fi

# torch's metadata asks for setuptools>=77; mmengine 0.10 needs pkg_resources
# and mmcv 2.1 builds with setuptools<70, which works with torch at run time:
# --no-warn-conflicts keeps pip from printing that known conflict as an ERROR.
has 'import wheel, ninja, numpy, cv2, setuptools as s
assert int(s.__version__.split(".")[0]) < 70 and numpy.__version__ < "2"' \
  || $PIP install --no-warn-conflicts -r requirements/build.txt

# mmcv 2.1.0 with ops: PyPI has only its source; about 7 minutes on 2 cores.
# pip's wheel cache keeps the built wheel, so a new venv reuses it.
has 'import mmcv.ops' || MMCV_WITH_OPS=1 $PIP install --no-build-isolation -r requirements/mmcv.txt
has 'import mmengine, mmdet' || $PIP install -r requirements/runtime.txt
has 'import mmdet3d' || $PIP install --no-deps -r requirements/mmdet3d.txt
# mmdet3d's metadata asks for open3d, left out on purpose (its visualiser
# only): --no-warn-conflicts keeps pip from printing that as an ERROR.
has 'import nuscenes, lyft_dataset_sdk, numba, trimesh, plyfile, skimage' \
  || $PIP install --no-warn-conflicts -r requirements/mmdet3d-deps.txt
has 'import pytest, hypothesis, flake8, isort, yapf' \
  || $PIP install --no-warn-conflicts -r requirements/tests.txt \
       -r requirements/lint.txt  # open3d, as above
# Editable: the tools run the installed package, so it must be this clone's
# files (-I: not found through the working directory, as a tool would not).
"$PY" -I -c 'import importlib.util as u, os, sys
s = u.find_spec("fast_parallel")
sys.exit(s is None or os.path.realpath(s.origin) != os.path.realpath(sys.argv[1]))' \
  "$PWD/fast_parallel/__init__.py" \
  || $PIP install --no-build-isolation --no-deps -e .
"$PY" -c 'import torch, mmcv, mmcv.ops, mmengine, mmdet, mmdet3d, fast_parallel
print("environment ready: torch", torch.__version__, "mmcv", mmcv.__version__,
      "mmengine", mmengine.__version__, "mmdet", mmdet.__version__,
      "mmdet3d", mmdet3d.__version__)'
