#!/usr/bin/env bash
# ansible-test sanity on the torchfleet.cluster collection, on a machine that reaches PyPI and no
# other host (docs/ansible-collection.md says how, and what tests/sanity/ignore-2.19.txt is for).
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
cd collections/ansible_collections/torchfleet/cluster
exec ansible-test sanity --color no --python "$(python -c 'import sys; print("%d.%d" % sys.version_info[:2])')" "$@"
