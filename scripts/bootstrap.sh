#!/usr/bin/env bash
# Set up the controller: a virtualenv in .venv with Ansible and torchfleet, installed in place.
#   ./scripts/bootstrap.sh          what a launch needs (the demo's set-up)
#   ./scripts/bootstrap.sh --test   that and the test tools (molecule, ansible-lint, torch, ...)
# Docker itself is installed and started by the local_cluster playbook.
set -euo pipefail
cd "$(dirname "$0")/.."
extras=""
[ "${1:-}" = --test ] && extras="[test]"

if ! python3 -c 'import ensurepip' 2>/dev/null; then
  echo "==> installing python3-venv"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv
fi
if [ ! -x .venv/bin/python ]; then
  echo "==> creating .venv"
  python3 -m venv .venv
fi
stamp=".venv/.torchfleet${extras:+-test}-$(cat pyproject.toml setup.py | sha1sum | cut -c1-12)"
if [ ! -f "$stamp" ]; then
  echo "==> installing torchfleet${extras} into .venv"
  .venv/bin/pip install --quiet --disable-pip-version-check -e ".${extras}" 2>&1 | grep -v "is ignored" || true
  .venv/bin/python -c 'import torchfleet, ansible_runner'
  touch "$stamp"
fi
# torchfleet is installed in place (-e), so pip compiled none of it; where
# PYTHONDONTWRITEBYTECODE is set (as on the CI machine), every Ansible worker that imports it,
# one per task and node, would compile it again: 73 ms of CPU each here, against 22 ms
# loaded from bytecode. compileall writes only what changed.
.venv/bin/python -m compileall -q torchfleet >/dev/null
