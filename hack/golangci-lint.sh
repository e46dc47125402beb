#!/usr/bin/env bash
# Runs the pinned golangci-lint with .golangci.yml on the whole module
# (arguments are passed to `golangci-lint run`). The binary is built once
# through the Go module proxy into .cache/bin, named by its version, so
# changing the pin installs the new one; --install-only stops there.
set -euo pipefail
cd "$(dirname "$0")/.."
GOLANGCI_LINT_VERSION=v2.15.0   # built with the module's Go (1.26)
bin=$(pwd)/.cache/bin
exe=$bin/golangci-lint-$GOLANGCI_LINT_VERSION
if [ ! -x "$exe" ]; then
  echo "installing golangci-lint $GOLANGCI_LINT_VERSION into .cache/bin (once; a few minutes)"
  mkdir -p "$bin"
  tmp=$(mktemp -d)
  GOBIN=$tmp GOFLAGS= go install "github.com/golangci/golangci-lint/v2/cmd/golangci-lint@$GOLANGCI_LINT_VERSION"
  mv "$tmp/golangci-lint" "$exe"
  rmdir "$tmp"
fi
if [ "${1:-}" = "--install-only" ]; then exit 0; fi
exec "$exe" run "$@"
