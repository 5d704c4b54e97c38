#!/usr/bin/env bash
# The release, built from this checkout's tracked files: the wheel (the torchfleet package with
# the torchfleet.cluster collection beside it) and the collection's tarball, into DIST.
#   ./scripts/release.sh [DIST]      (default: dist/)
# It builds from a copy, so that neither build writes into the checkout (build/, *.egg-info).
set -euo pipefail
cd "$(dirname "$0")/.."
dist=$(realpath -m "${1:-dist}")
src=$(mktemp -d)
trap 'rm -rf "$src"' EXIT
git ls-files -z | tar --null -T - -cf - | tar -x -C "$src"
# The collection carries the package's files it ships to the nodes (the run's vocabulary) as
# links in the checkout; ansible-galaxy keeps a link whose target it leaves out, so they go
# in as the files they name.
find "$src/plugins" -type l | while read -r link; do
  cp --remove-destination "$(readlink -f "$link")" "$link"
done
mkdir -p "$dist"
echo "==> the wheel"
python -m pip wheel --quiet --no-deps --no-build-isolation --wheel-dir "$dist" "$src"
echo "==> the collection"
ansible-galaxy collection build "$src" --output-path "$dist" --force
ls -l "$dist"
