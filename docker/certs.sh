#!/usr/bin/env bash
# Development credentials for a TLS federation with SuperNode authentication
# (docker/with-tls.yml, or `pflower deploy up --certificates DIR --node-keys DIR`):
#
#   ca.crt, ca.key          a self-signed certificate authority
#   server.pem, server.key  the SuperLink's certificate (Fleet, Control and runtime APIs), signed
#                           by the CA, valid for localhost, 127.0.0.1, ::1, the compose service
#                           name `superlink`, and every -s name
#   supernode-<i>[.pub]     one EC P-384 key pair per SuperNode (OpenSSH format); the SuperLink
#                           admits a node once its public key is registered with
#                           `flwr supernode register supernode-<i>.pub <connection>`
#
# For development only: keys are created without a passphrase and made readable by the
# containers' unprivileged user. Use certificates from your own CA in production.
#
# Usage: docker/certs.sh [-o OUT_DIR] [-n NUM_NODES] [-s SAN]...
#   -o  output directory (default: docker/certs next to this script)
#   -n  number of SuperNode key pairs (default: 3)
#   -s  extra subject alternative name for the SuperLink, e.g. -s DNS:fl.example.org -s IP:10.0.0.5
set -euo pipefail

out="$(cd "$(dirname "$0")" && pwd)/certs"
nodes=3
sans=("DNS:localhost" "DNS:superlink" "IP:127.0.0.1" "IP:::1")
days=365

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; }

while getopts "o:n:s:h" opt; do
  case "$opt" in
    o) out="$OPTARG" ;;
    n) nodes="$OPTARG" ;;
    s) sans+=("$OPTARG") ;;
    h) usage; exit 0 ;;
    *) usage >&2; exit 2 ;;
  esac
done

command -v openssl >/dev/null || { echo "certs.sh needs openssl" >&2; exit 1; }
command -v ssh-keygen >/dev/null || { echo "certs.sh needs ssh-keygen (openssh-client)" >&2; exit 1; }
[[ "$nodes" =~ ^[0-9]+$ ]] || { echo "-n takes a number, got '$nodes'" >&2; exit 2; }

mkdir -p "$out"
cd "$out"

# Certificate authority
openssl ecparam -name prime256v1 -genkey -noout -out ca.key
openssl req -x509 -new -key ca.key -sha256 -days "$days" -subj "/CN=pflower development CA" \
  -out ca.crt

# SuperLink certificate, signed by the CA
san_list="$(IFS=,; echo "${sans[*]}")"
openssl ecparam -name prime256v1 -genkey -noout -out server.key
openssl req -new -key server.key -subj "/CN=superlink" -out server.csr
cat > server.ext <<EOF
basicConstraints = CA:FALSE
keyUsage = digitalSignature, keyEncipherment
extendedKeyUsage = serverAuth
subjectAltName = $san_list
EOF
openssl x509 -req -in server.csr -CA ca.crt -CAkey ca.key -CAcreateserial -sha256 \
  -days "$days" -extfile server.ext -out server.pem 2>/dev/null
rm -f server.csr server.ext ca.srl

# One key pair per SuperNode
for ((i = 0; i < nodes; i++)); do
  rm -f "supernode-$i" "supernode-$i.pub"
  ssh-keygen -q -t ecdsa -b 384 -N "" -C "supernode-$i" -f "supernode-$i"
done

# Readable by the containers' user (uid 49999); the CA key stays private.
chmod 600 ca.key
chmod 644 ca.crt server.pem server.key supernode-*

echo "wrote CA, SuperLink certificate (${san_list}) and $nodes SuperNode key pairs to $out"
