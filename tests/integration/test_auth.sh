#!/usr/bin/env bash
# Security end to end (docs/security.md): a MetaServer and nodes A, B, C in their own network
# namespaces (p2p_netns.sh), every process with mutual TLS (a test CA made here by certs.sh),
# a cluster token and an admin token; the test client (libpegaflow) takes its certificate
# and the token from PEGAFLOW_TLS_* / PEGAFLOW_TOKEN_FILE. The client's certificate also names
# 10.77.0.200, an address nobody has: a handshake proven only by the certificate.
#   basic  the whole P2P basic scenario (save, discovery, handshake, fetch byte-exact) secured
#   auth   wrong certificate, no certificate, plaintext, no token, wrong token refused by the
#          MetaServer and a node; worker RPCs from another host, the Unix socket listener,
#          spoofed handshakes, HTTP admin token, a node with the wrong token (p2p_e2e.c)
set -u
: "${PF_BIN:?}" "${PF_TESTBIN:?}"
here=$(cd "$(dirname "$0")" && pwd)
. "$here/certs.sh"
pki=$(mktemp -d "${TMPDIR:-/tmp}/pf-pki.XXXXXX")
trap 'rm -rf "$pki"' EXIT
make_certs "$pki" ms=10.77.0.10,127.0.0.1 a=10.77.0.2,127.0.0.2 b=10.77.0.3,127.0.0.3 \
  c=10.77.0.4,127.0.0.4 t=10.77.0.100,127.0.0.1,10.77.0.200 || { echo "cannot make the test PKI"; exit 1; }
export PF_P2P_SECURITY_DIR=$pki
export PEGAFLOW_TLS_CA=$pki/ca.crt PEGAFLOW_TLS_CERT=$pki/t.crt PEGAFLOW_TLS_KEY=$pki/t.key
export PEGAFLOW_TOKEN_FILE=$pki/token
bash "$here/p2p_netns.sh" basic auth "$@"
