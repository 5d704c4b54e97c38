#!/usr/bin/env bash
# The whole test suite: linters, molecule scenarios on local docker hosts, and pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/bootstrap.sh
# shellcheck disable=SC1091
source .venv/bin/activate

step() { printf '\n\033[1m==> %s\033[0m\n' "$*"; }

step "yamllint"
yamllint --strict .
step "ansible-lint (production profile)"
ansible-lint
step "molecule scenarios (each builds its own docker hosts)"
for scenario in default image-pull tls mpirun bare-metal; do
  molecule test --scenario-name "$scenario"
done
step "pytest"
pytest -ra tests
