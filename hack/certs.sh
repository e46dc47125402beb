#!/usr/bin/env bash
# Create a CA, a server certificate for kvroute and a client certificate for
# Envoy, for local runs and the end-to-end tests (Kubernetes: use
# cert-manager, see docs/deploy.md).
#
#   hack/certs.sh DIR [SERVER_NAME...]
#
# DIR gets ca.pem/ca-key.pem, server.pem/server-key.pem (SANs: localhost,
# 127.0.0.1, ::1 and every SERVER_NAME) and client.pem/client-key.pem
# (CN envoy, clientAuth), and Envoy's SDS files naming them
# (envoy-client-sds.yaml, envoy-ca-sds.yaml). Keys are ECDSA P-256;
# certificates last 365 days.
# Re-running replaces the leaf certificates and keeps an existing CA, so a
# running kvroute reloads them without a restart.
set -euo pipefail
dir=${1:?usage: hack/certs.sh DIR [SERVER_NAME...]}
shift
mkdir -p "$dir"
cd "$dir"
umask 077

if [ ! -s ca.pem ] || [ ! -s ca-key.pem ]; then
  openssl ecparam -name prime256v1 -genkey -noout -out ca-key.pem
  openssl req -x509 -new -key ca-key.pem -sha256 -days 3650 -subj "/CN=kvroute local CA" \
    -addext "basicConstraints=critical,CA:true" -addext "keyUsage=critical,keyCertSign,cRLSign" \
    -out ca.pem 2>/dev/null
fi

san="DNS:localhost,IP:127.0.0.1,IP:::1"
for n in "$@"; do
  if [[ $n =~ ^[0-9.]+$ || $n == *:* ]]; then san="$san,IP:$n"; else san="$san,DNS:$n"; fi
done

leaf() { # name cn extendedKeyUsage [san]
  local name=$1 cn=$2 eku=$3 alt=${4:-}
  openssl ecparam -name prime256v1 -genkey -noout -out "$name-key.pem.tmp"
  openssl req -new -key "$name-key.pem.tmp" -subj "/CN=$cn" -out "$name.csr" 2>/dev/null
  {
    echo "basicConstraints=critical,CA:false"
    echo "keyUsage=critical,digitalSignature,keyEncipherment"
    echo "extendedKeyUsage=$eku"
    [ -n "$alt" ] && echo "subjectAltName=$alt"
  } > "$name.ext"
  openssl x509 -req -in "$name.csr" -CA ca.pem -CAkey ca-key.pem -CAcreateserial -sha256 -days 365 \
    -extfile "$name.ext" -out "$name.pem.tmp" 2>/dev/null
  rm -f "$name.csr" "$name.ext"
  # Key first, then certificate, each by rename: a reader never sees a
  # half-written file (a reload in between fails and keeps the old pair).
  mv "$name-key.pem.tmp" "$name-key.pem"
  mv "$name.pem.tmp" "$name.pem"
}
leaf server kvroute serverAuth "$san"
leaf client envoy clientAuth
rm -f ca.srl
chmod 0644 ca.pem server.pem client.pem

# Envoy's SDS files (envoy/envoy-mtls.yaml): its client certificate and the
# CA it checks kvroute with, by absolute path. Written only when missing:
# they name files, and the files' contents are what rotates.
sds() { # file secret-yaml
  [ -s "$1" ] && return 0
  printf 'resources:\n- "@type": type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret\n%s\n' "$2" > "$1.tmp"
  chmod 0644 "$1.tmp"
  mv "$1.tmp" "$1"
}
here=$(pwd)
sds envoy-client-sds.yaml "  name: kvroute_extproc_client
  tls_certificate:
    certificate_chain: {filename: $here/client.pem}
    private_key: {filename: $here/client-key.pem}"
sds envoy-ca-sds.yaml "  name: kvroute_extproc_ca
  validation_context:
    trusted_ca: {filename: $here/ca.pem}"
echo "certs in $dir: ca.pem server.pem server-key.pem client.pem client-key.pem (Envoy SDS: envoy-client-sds.yaml envoy-ca-sds.yaml)"
