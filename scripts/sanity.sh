#!/usr/bin/env bash
# ansible-test sanity on the torchfleet.cluster collection as it ships: built from this
# checkout's tracked files (scripts/release.sh), installed into a folder of its own, with the
# checkout's tests/sanity beside it. It needs a machine that reaches PyPI and no other host
# (docs/ansible-collection.md says how, and what tests/sanity/ignore-2.19.txt is for).
#   ./scripts/sanity.sh                           every sanity test
#   ./scripts/sanity.sh --test validate-modules   one test (any ansible-test sanity option)
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${VIRTUAL_ENV:-}" ]; then
  # shellcheck disable=SC1091
  source .venv/bin/activate
fi
# The pip bootstrap that ansible-test would download for its sanity venvs, made from PyPI.
python scripts/ansible_test_pip.py >/dev/null
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
./scripts/release.sh "$work/dist" >/dev/null
ansible-galaxy collection install --force --no-deps -p "$work" "$work"/dist/torchfleet-cluster-*.tar.gz >/dev/null 2>&1
collection="$work/ansible_collections/torchfleet/cluster"
mkdir -p "$collection/tests"
cp -r tests/sanity "$collection/tests/"
cd "$collection"
ansible-test sanity --color no --python "$(python -c 'import sys; print("%d.%d" % sys.version_info[:2])')" "$@"
