#!/usr/bin/env bash
# The whole test suite: linters, unit tests, molecule scenarios on local docker hosts, and the
# API/CLI tests and the fault matrix on a cluster of their own. It ends with a table of each stage's wall time.
#   ./scripts/test.sh --quick          linters and unit tests only
#   SCENARIOS="tls mpirun" ./scripts/test.sh   only those scenarios (and no cluster pytest)
#   SCENARIOS="pytest-faults" ./scripts/test.sh  only the fault matrix (pytest-cluster: only the
#                                               API and CLI tests; pytest: both, on one cluster)
#   SCENARIOS="pytest-recovery" ./scripts/test.sh  only the restarts' cases, on three hosts of their own
#   LANES=1 ./scripts/test.sh          the cluster stages one after another (LANES=3: in three)
# The cluster stages wait on docker, on training and on timeouts, so by default they run in
# two lanes at once (in three, the two cores were shared so thinly that the default scenario
# alone took 27 min against 18); each stage's output goes to .torchfleet/test-logs/<stage>.log
# and the end of a failed stage's log is printed.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/bootstrap.sh --test
# shellcheck disable=SC1091
source .venv/bin/activate

# Set below once this run's images stage has made them, never taken from the caller.
unset TORCHFLEET_IMAGES_READY
quick=false
[ "${1:-}" = --quick ] && quick=true
lanes=${LANES:-2}
logs=.torchfleet/test-logs
rm -rf "$logs" && mkdir -p "$logs"
started=$SECONDS

# stage NAME CMD...: runs it, logging to $logs/NAME.log, and records "NAME wall rc".
stage() {
  local name=$1 t0=$SECONDS rc=0 log="$logs/${1// /-}.log"
  shift
  printf '\033[1m==> %s\033[0m  (log: %s)\n' "$name" "$log"
  "$@" >"$log" 2>&1 || rc=$?
  printf '%s\t%s\t%s\n' "$name" $((SECONDS - t0)) "$rc" >>"$logs/times.tsv"
  if [ "$rc" = 0 ]; then
    printf '    %s passed in %ss\n' "$name" $((SECONDS - t0))
  else
    printf '\033[31m    %s FAILED (exit %s) in %ss\033[0m\n' "$name" "$rc" $((SECONDS - t0))
    # A molecule scenario's log ends with its destroy: what failed comes first, with the
    # task above each failure and what it printed.
    printf '    what failed:\n'
    sed 's/\x1b\[[0-9;]*m//g' "$log" | grep -n -B 3 -A 25 -E 'fatal: \[|failed: \[|\[ERROR\]: Task failed|^(FAILED|ERROR) tests/' \
      | head -n 150 | sed 's/^/    | /' || true
    printf '    the end of its log:\n'
    tail -n 40 "$log" | sed 's/^/    | /'
  fi
}

# A lane runs its stages one after another.
lane() {
  local item
  for item in "$@"; do
    case $item in
      # The API and CLI tests and the fault matrix share their two docker hosts (tests/conftest.py).
      pytest) stage "pytest cluster+faults" pytest -q -ra --durations=0 -m "cluster or faults" tests ;;
      pytest-cluster) stage "pytest cluster" pytest -q -ra --durations=8 -m cluster tests ;;
      pytest-faults) stage "pytest faults" pytest -q -ra --durations=0 -m faults tests ;;
      # Runs that restart, on three docker hosts of their own (tests/recovery/conftest.py).
      pytest-recovery) stage "pytest recovery" pytest -q -ra --durations=0 -m recovery tests ;;
      *) stage "molecule $item" molecule test --scenario-name "$item" ;;
    esac
  done
}

# Debian's headless Chromium, for the live-curves test in the recovery stage (it stays
# visibly skipped without it); installed here, beside the image build, long before that stage.
browser() {
  command -v chromium >/dev/null && command -v chromedriver >/dev/null && return 0
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver
}

# The linters and unit tests, as one lane of their own.
checks() {
  $quick || stage "chromium" browser
  stage "yamllint" yamllint --strict .
  stage "ansible-lint" ansible-lint
  # Before the unit tests, whose validate-modules test reuses the sanity venvs it makes.
  stage "ansible-test sanity" ./scripts/sanity.sh
  stage "pytest unit" pytest -q -ra -m "not cluster and not faults and not recovery" tests
}

pids=()
if $quick; then
  checks
else
  # The checks run beside the image build, which mostly waits on docker.
  checks &
  pids+=($!)
  # The training image and the node image are built once, before the lanes share them, and
  # so is the engine data that the nodes of scenarios not testing the image's load start from.
  stage "images" ansible-playbook playbooks/local_cluster.yml -e local_cluster_nodes=0 \
    -e local_cluster_make_seed=true -e local_cluster_engine_seed="${TORCHFLEET_TEST_PREFIX:-molecule}-engine-seed"
  # Made and checked once: each scenario's cluster then skips that part of the harness.
  if awk -F'\t' '$1 == "images" && $3 == 0 {ok = 1} END {exit !ok}' "$logs/times.tsv"; then
    export TORCHFLEET_IMAGES_READY=1
  fi
  # Each lane's stages, one lane per line. Balanced by their wall times in minutes on a
  # fresh clone of this 2-core machine (docs/testing.md); each lane starts with a heavy converge.
  if [ -n "${SCENARIOS:-}" ]; then
    plan=$SCENARIOS
  elif [ "$lanes" -ge 3 ]; then
    plan=$'mpirun tls image-pull pytest-recovery\ndefault bare-metal slurm\npytest overlay'
  elif [ "$lanes" -ge 2 ]; then
    # slurm: 6m23s on its own under a load of about 9 (its largest task: the apt install of
    # Slurm and munge, 34 s), in the lane that ended first. pytest-recovery (6m alone, about
    # 10m beside other work) now ends that lane, and tls moved to the other to keep them even.
    plan=$'default bare-metal overlay slurm pytest-recovery\nmpirun pytest image-pull tls'
  else
    plan="default image-pull tls mpirun bare-metal overlay slurm pytest pytest-recovery"
  fi
  while read -r -a items; do
    lane "${items[@]}" </dev/null &
    pids+=($!)
  done <<<"$plan"
fi
for pid in "${pids[@]}"; do wait "$pid" || true; done

failed=0
printf '\n%-24s %9s  %s\n' stage wall result
printf '%s\n' '--------------------------------------------'
while IFS=$'\t' read -r name wall rc; do
  if [ "$rc" = 0 ]; then result=ok; else result="FAILED ($rc)"; failed=1; fi
  printf '%-24s %5dm%02ds  %s\n' "$name" $((wall / 60)) $((wall % 60)) "$result"
done <"$logs/times.tsv"
printf '%s\n' '--------------------------------------------'
printf '%-24s %5dm%02ds  (%s lanes)\n' total $(((SECONDS - started) / 60)) $(((SECONDS - started) % 60)) "$lanes"
exit "$failed"
