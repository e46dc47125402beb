#!/usr/bin/env bash
# Builds the kvroute container image without pulling a base image: the binary
# is compiled here (cgo, libzmq), its shared libraries are staged beside it,
# and buildah assembles hack/image/Containerfile on top of an empty (scratch)
# image.
#
# Usage: hack/image/build.sh [-t name:tag] [--root DIR] [--runroot DIR]
#   -t          image name (default kvroute/kvroute:$VERSION without its "v")
#   --root, --runroot
#               buildah storage directories (default: buildah's own); tests
#               pass temporary ones.
# Environment: VERSION, COMMIT (default: from git), BUILDAH_STORAGE_DRIVER
# (default vfs: works without overlay or fuse support).
set -euo pipefail
cd "$(dirname "$0")/../.."

# The same stamp as make build: the binary reports VERSION+COMMIT; the image
# tag is VERSION without its leading "v" (a tag cannot hold "+"), which is
# what the chart's default image names for a release (appVersion).
# Without a v* tag: v + the chart's appVersion (the tag the chart installs).
app=$(sed -n 's/^appVersion: *"*\([^"]*\)"*/\1/p' charts/kvroute/Chart.yaml)
VERSION=${VERSION:-$(git describe --tags --match 'v*' --abbrev=0 2>/dev/null || echo "v$app")}
COMMIT=${COMMIT:-$(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)}
tag="kvroute/kvroute:${VERSION#v}"
storage=()
while [ $# -gt 0 ]; do
  case "$1" in
    -t) tag=$2; shift 2 ;;
    --root|--runroot) storage+=("$1" "$2"); shift 2 ;;
    *) echo "build.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
command -v buildah >/dev/null || { echo "build.sh: buildah not found (make deps installs it)" >&2; exit 1; }

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/usr/local/bin" "$stage/etc/ssl/certs" "$stage/etc/kvroute" "$stage/tmp"

CGO_ENABLED=1 go build -tags vtprotobuf -trimpath -buildvcs=false \
  -ldflags "-s -w -X main.version=${VERSION}+${COMMIT}" \
  -o "$stage/usr/local/bin/kvroute" ./cmd/kvroute

# Every shared object the binary loads, at the path the loader looks for it,
# plus the loader itself (the PT_INTERP path).
bin="$stage/usr/local/bin/kvroute"
interp=$(readelf -l "$bin" | sed -n 's/.*Requesting program interpreter: \(.*\)]/\1/p')
libs=$(ldd "$bin" | awk '/=> \//{print $3} /^\t\//{print $1}' | sort -u)
for f in $interp $libs; do
  mkdir -p "$stage$(dirname "$f")"
  cp -L "$f" "$stage$f"
  # ldd lists the canonical path; the loader may also look under the
  # multiarch alias that libzmq's DT_RUNPATH names. Both resolve here.
done
[ -f /etc/ssl/certs/ca-certificates.crt ] && cp /etc/ssl/certs/ca-certificates.crt "$stage/etc/ssl/certs/"
printf 'root:x:0:0:root:/:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/:/sbin/nologin\n' >"$stage/etc/passwd"
printf 'root:x:0:\nnonroot:x:65532:\n' >"$stage/etc/group"

export BUILDAH_ISOLATION=chroot
driver=${BUILDAH_STORAGE_DRIVER:-vfs}
buildah "${storage[@]}" --storage-driver "$driver" bud --quiet \
  --label "org.opencontainers.image.version=${VERSION#v}" \
  --label "org.opencontainers.image.revision=${COMMIT}" \
  --label "org.opencontainers.image.title=kvroute" \
  -f "$PWD/hack/image/Containerfile" -t "$tag" "$stage" >/dev/null
echo "built $tag"
