#!/usr/bin/env bash
# Regenerates the committed protobuf Go code with pinned plugins.
# With --verify, regenerates into a temporary tree and fails if the committed
# code differs; with --install-only, only installs the plugins.
set -euo pipefail
cd "$(dirname "$0")/.."
PROTOC_GEN_GO=google.golang.org/protobuf/cmd/protoc-gen-go@v1.36.12
PROTOC_GEN_GO_GRPC=google.golang.org/grpc/cmd/protoc-gen-go-grpc@v1.5.1
bin=$(pwd)/.cache/bin
mkdir -p "$bin"
[ -x "$bin/protoc-gen-go" ] || GOBIN=$bin GOFLAGS= go install "$PROTOC_GEN_GO"
[ -x "$bin/protoc-gen-go-grpc" ] || GOBIN=$bin GOFLAGS= go install "$PROTOC_GEN_GO_GRPC"
if [ "${1:-}" = "--install-only" ]; then exit 0; fi
command -v protoc >/dev/null || { echo "protoc missing: apt-get install protobuf-compiler"; exit 1; }
out=.
if [ "${1:-}" = "--verify" ]; then out=$(mktemp -d); fi
protos=$(find proto -name '*.proto' | sort)
PATH=$bin:$PATH protoc -I proto --go_out="$out" --go_opt=module=github.com/kvroute/kvroute \
  --go-grpc_out="$out" --go-grpc_opt=module=github.com/kvroute/kvroute $protos
if [ "${1:-}" = "--verify" ]; then
  for f in $(cd "$out" && find proto -name '*.go'); do
    cmp -s "$out/$f" "$f" || { echo "generated code is stale: $f (run make generate)"; exit 1; }
  done
  rm -rf "$out"
  echo "generated code up to date"
fi
