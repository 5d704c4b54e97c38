#!/usr/bin/env bash
# The main job on the embedded default cluster: 3 docker hosts on this machine,
# provisioned by site.yml, then one 3-rank DDP training job across them.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/bootstrap.sh
# shellcheck disable=SC1091
source .venv/bin/activate

step() { printf '\n\033[1m==> %s\033[0m\n' "$*"; }
timed() { local t0=$SECONDS; "$@"; printf '    (%ss)\n' "$((SECONDS - t0))"; }

step "Creating the local cluster (docker hosts with sshd and their own engine)"
timed ansible-playbook playbooks/local_cluster.yml
step "Provisioning the nodes: ansible-playbook site.yml"
timed ansible-playbook site.yml
step "Launching the training job: ansible-playbook playbooks/launch.yml"
timed ansible-playbook playbooks/launch.yml "$@"
step "Done. The run's logs, model, loss plot and summary.json are in runs/$(ls -t runs | head -1)/"
