# Test PKI for the security tests (sourced): make_certs DIR NAME=IP[,IP]... writes
#   DIR/ca.crt            the cluster CA
#   DIR/NAME.crt, .key    a certificate per NAME signed by it, subjectAltName IP:<each IP>
#   DIR/rogue-ca.crt      another CA
#   DIR/rogue.crt, .key   a certificate signed by the other CA (IPs of the first NAME)
#   DIR/token, DIR/admin-token, DIR/wrong-token   random tokens (mode 0600)
# Keys are EC P-256; everything is made fresh per run and lives only in DIR.
make_certs() {
  local dir=$1; shift
  command -v openssl >/dev/null || { echo "openssl missing (ci/install-deps.sh)"; return 1; }
  mkdir -p "$dir" || return 1
  (
    set -e
    cd "$dir"
    umask 077
    for ca in ca rogue-ca; do
      openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 \
        -subj "/CN=pegaflow test $ca" -keyout "$ca.key" -out "$ca.crt" 2>/dev/null
    done
    local first=
    for spec in "$@"; do
      local name=${spec%%=*} ips=${spec#*=} san= ip
      IFS=, read -ra list <<<"$ips"
      for ip in "${list[@]}"; do san="${san:+$san,}IP:$ip"; done
      [ -n "$first" ] || first=$san
      sign() { # sign NAME CA SAN
        openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "/CN=$1" \
          -keyout "$1.key" -out "$1.csr" 2>/dev/null
        printf 'subjectAltName=%s\nextendedKeyUsage=serverAuth,clientAuth\n' "$3" >"$1.ext"
        openssl x509 -req -in "$1.csr" -CA "$2.crt" -CAkey "$2.key" -CAcreateserial -days 2 \
          -extfile "$1.ext" -out "$1.crt" 2>/dev/null
        rm -f "$1.csr" "$1.ext"
      }
      sign "$name" ca "$san"
    done
    sign rogue rogue-ca "$first"
    openssl rand -hex 24 >token
    openssl rand -hex 24 >admin-token
    openssl rand -hex 24 >wrong-token
  )
}
