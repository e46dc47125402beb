#!/usr/bin/env bash
# Enforces the package map's one-way arrows (docs/architecture.md): the pure
# core imports nothing of ours beyond what the map allows, and nothing in pkg/
# imports the edge packages.
set -euo pipefail
mod=github.com/kvroute/kvroute
fail=0
check() { # pkg allowed-regex
  local pkg=$1 allowed=$2
  [ -d "$pkg" ] || return 0
  local deps
  deps=$(go list -f '{{join .Imports "\n"}}' "./$pkg" | grep "^$mod/" || true)
  for d in $deps; do
    if ! [[ "$d" =~ ^$mod/($allowed)$ ]]; then
      echo "import rule: $pkg must not import $d"; fail=1
    fi
  done
}
check pkg/kvblock '^$'
check pkg/index 'pkg/kvblock'
check pkg/load '^$'
check pkg/policy 'pkg/index|pkg/load'
check pkg/route 'pkg/kvblock|pkg/index|pkg/load|pkg/policy'
check pkg/jsonscan '^$'
check pkg/enginehttp '^$'
check pkg/respstore 'pkg/enginehttp'
check pkg/pyfmt '^$'
check pkg/openai 'pkg/jsonscan|pkg/pyfmt'
check pkg/tokenize 'pkg/route|pkg/jsonscan|pkg/pyfmt'
check pkg/discovery '^$'
# The replica-set controller drives discovery's snapshots into events; it is
# the one package besides cmd/ that may import those two edges.
check pkg/fleet 'pkg/discovery|pkg/events|pkg/index|pkg/load|pkg/route'
for p in $(go list ./pkg/... ); do
  for edge in pkg/extproc pkg/events pkg/discovery pkg/admin; do
    [[ "$p" == "$mod/$edge"* ]] && continue
    [[ "$p" == "$mod/pkg/fleet" && ( "$edge" == pkg/discovery || "$edge" == pkg/events ) ]] && continue
    if go list -f '{{join .Imports "\n"}}' "$p" | grep -qx "$mod/$edge"; then
      echo "import rule: $p must not import $mod/$edge"; fail=1
    fi
  done
done
exit $fail
