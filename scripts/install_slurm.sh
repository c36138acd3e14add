#!/usr/bin/env bash
# Debian's Slurm and munge for tests/test_clusters.py (a one-node cluster
# the test starts and stops itself), where this machine allows it: as root,
# with apt-get. Never fails: where it cannot install, it says why and the
# Slurm test skips with the same reason. `make test` runs it once (a stamp
# in the environment folder).
set -u
if command -v slurmctld >/dev/null && command -v slurmd >/dev/null \
    && command -v munged >/dev/null && command -v srun >/dev/null; then
  echo "install_slurm: Slurm and munge are installed"
  exit 0
fi
if [ "$(id -u)" != 0 ]; then
  echo "install_slurm: not root: Slurm not installed (the Slurm test skips)"
  exit 0
fi
if ! command -v apt-get >/dev/null; then
  echo "install_slurm: no apt-get: Slurm not installed (the Slurm test skips)"
  exit 0
fi
export DEBIAN_FRONTEND=noninteractive
# bounded: a machine without a reachable mirror must not hold `make test`
if timeout 600 apt-get install -y -q slurm-wlm munge \
    >/tmp/install_slurm.log 2>&1 || {
  timeout 300 apt-get update -q >>/tmp/install_slurm.log 2>&1 &&
    timeout 600 apt-get install -y -q slurm-wlm munge \
      >>/tmp/install_slurm.log 2>&1
}; then
  echo "install_slurm: installed slurm-wlm and munge"
else
  echo "install_slurm: apt-get could not install slurm-wlm munge (see" \
    "/tmp/install_slurm.log): the Slurm test skips"
fi
exit 0
