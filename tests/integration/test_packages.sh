#!/usr/bin/env bash
# The packages (make deb, make wheel) from this build:
# * the .deb, unpacked into a scratch root with dpkg -x, holds both servers, pegaflow-cli,
#   libpegaflow.so + header + pkg-config file, systemd units reading /etc/default/pegaflow-*,
#   and man pages listing every flag of --help; the units' command lines (ExecStart with the
#   variables of their EnvironmentFile, as an operator edits it) start both servers, which
#   answer Health and stop with status 0 on SIGTERM; a program built with the .pc file
#   against the unpacked header and library runs;
# * the wheel installs offline into a clean venv (--system-site-packages, --no-index) and
#   finds the libpegaflow.so inside it, with the server's version.
. "${PF_TOP:?PF_TOP must name the repository (make test sets it)}/tests/integration/lib.sh" || exit 1
set -uo pipefail
pf_tmpdir
O=$(dirname "$PF_BIN")
py=/usr/bin/python3
version=$("$PF_BIN/pegaflow-server" --version) || pf_fail "--version"
command -v dpkg-deb >/dev/null || { echo "SKIP: dpkg-deb is not installed (not a Debian system)"; exit 77; }
# packages are made from release builds: a sanitizer build's library cannot be loaded by a
# plain client or python without its runtime preloaded (the plain `make test` runs this)
[ -z "${PF_SAN:-}" ] || { echo "SKIP: packages are built from the release build, not SAN=$PF_SAN"; exit 77; }

# ---- .deb
"$PF_TOP/ci/mkdeb.sh" "$O" "$version" "$PF_TMP/pkg" >"$PF_TMP/mkdeb.log" 2>&1 || pf_fail "mkdeb"
deb="$PF_TMP/pkg/pegaflow_${version}_$(dpkg --print-architecture).deb"
[ -f "$deb" ] || pf_fail "no $deb"
info=$(dpkg-deb -f "$deb" Package Version Architecture Depends) || pf_fail "dpkg-deb -f"
echo "$info"
grep -qx "Package: pegaflow" <<<"$info" || pf_fail "Package field"
grep -qx "Version: $version" <<<"$info" || pf_fail "Version field"
grep -q '^Depends: .*libgrpc' <<<"$info" || pf_fail "Depends lacks gRPC: $info"
root="$PF_TMP/root"
dpkg -x "$deb" "$root" || pf_fail "dpkg -x"
ma=$(dpkg-architecture -qDEB_HOST_MULTIARCH 2>/dev/null || gcc -print-multiarch)
for f in usr/bin/pegaflow-server usr/bin/pegaflow-metaserver usr/bin/pegaflow-cli \
  "usr/lib/$ma/libpegaflow.so" usr/include/pegaflow/pegaflow.h "usr/lib/$ma/pkgconfig/pegaflow.pc" \
  lib/systemd/system/pegaflow-server.service lib/systemd/system/pegaflow-metaserver.service \
  etc/default/pegaflow-server etc/default/pegaflow-metaserver \
  usr/share/man/man1/pegaflow-server.1.gz usr/share/man/man1/pegaflow-metaserver.1.gz; do
  [ -e "$root/$f" ] || pf_fail "the .deb lacks /$f"
done
dpkg-deb -e "$deb" "$PF_TMP/control" || pf_fail "dpkg-deb -e"
grep -qx /etc/default/pegaflow-server "$PF_TMP/control/conffiles" ||
  pf_fail "/etc/default/pegaflow-server is not a conffile"

# man pages list every flag --help lists
for s in pegaflow-server pegaflow-metaserver; do
  man=$(zcat "$root/usr/share/man/man1/$s.1.gz")
  for f in $("$root/usr/bin/$s" --help | grep -oE '^  --[a-z0-9-]+' | tr -d ' '); do
    grep -qF -- "\\fB$(sed 's/-/\\-/g' <<<"$f")\\fR" <<<"$man" || pf_fail "man $s lacks $f"
  done
done

# the units: a dedicated user, the capabilities the server needs and the usual sandbox
# (docs/security.md "Files and units")
for s in pegaflow-server pegaflow-metaserver; do
  u="$root/lib/systemd/system/$s.service"
  for want in User=pegaflow Group=pegaflow NoNewPrivileges=yes ProtectSystem=strict ProtectHome=yes \
    PrivateTmp=yes ProtectKernelModules=yes RestrictNamespaces=yes; do
    grep -qx "$want" "$u" || pf_fail "$s.service lacks $want"
  done
done
u="$root/lib/systemd/system/pegaflow-server.service"
for want in LimitMEMLOCK=infinity AmbientCapabilities=CAP_IPC_LOCK CapabilityBoundingSet=CAP_IPC_LOCK \
  DevicePolicy=closed 'DeviceAllow=char-nvidia* rw' 'DeviceAllow=char-infiniband_verbs rw' \
  ReadWritePaths=/var/lib/pegaflow RuntimeDirectory=pegaflow; do
  grep -qxF "$want" "$u" || pf_fail "pegaflow-server.service lacks $want"
done
grep -qx 'CapabilityBoundingSet=' "$root/lib/systemd/system/pegaflow-metaserver.service" ||
  pf_fail "pegaflow-metaserver.service keeps capabilities"
# systemd-analyze verify prints problems (unknown keys, bad values) but exits 0 for most:
# any output fails. ExecStart points into the unpacked root (the binaries are not installed)
if command -v systemd-analyze >/dev/null; then
  for s in pegaflow-server pegaflow-metaserver; do
    sed "s|^ExecStart=/usr/bin/|ExecStart=$root/usr/bin/|" "$root/lib/systemd/system/$s.service" \
      >"$PF_TMP/$s.service"
    out=$(systemd-analyze verify --man=no "$PF_TMP/$s.service" 2>&1) ||
      pf_fail "systemd-analyze verify $s.service failed: $out"
    [ -z "$out" ] || pf_fail "systemd-analyze verify $s.service: $out"
  done
  # the check itself sees a broken unit
  sed 's/^ProtectSystem=strict/ProtectSystem=strictest/' "$PF_TMP/pegaflow-server.service" >"$PF_TMP/bad.service"
  [ -n "$(systemd-analyze verify --man=no "$PF_TMP/bad.service" 2>&1)" ] ||
    pf_fail "systemd-analyze verify did not notice a bad value"
  echo "ok: systemd-analyze verify (both units)"
else
  echo "SKIP (units only): systemd-analyze is not installed, the units are not verified"
fi
# postinst: creates the system group and user once (idempotent), /etc/pegaflow root:pegaflow
# 0750; run against stand-ins of getent/groupadd/useradd/install that record their calls
[ -x "$PF_TMP/control/postinst" ] || pf_fail "the .deb has no executable postinst"
sh -n "$PF_TMP/control/postinst" || pf_fail "postinst does not parse"
shim="$PF_TMP/shim"
mkdir -p "$shim"
for c in groupadd useradd install systemctl; do
  printf '#!/bin/sh\necho "%s $*" >>"%s/calls"\n' "$c" "$shim" >"$shim/$c"
done
printf '#!/bin/sh\n[ -e "%s/known" ] && exit 0 || exit 2\n' "$shim" >"$shim/getent"
chmod +x "$shim"/*
PATH="$shim:$PATH" sh "$PF_TMP/control/postinst" configure || pf_fail "postinst configure failed"
grep -qx 'groupadd --system pegaflow' "$shim/calls" || pf_fail "postinst: no system group: $(cat "$shim/calls")"
grep -q '^useradd --system --gid pegaflow .*--shell /usr/sbin/nologin .*pegaflow$' "$shim/calls" ||
  pf_fail "postinst: no system user: $(cat "$shim/calls")"
grep -qx 'install -d -o root -g pegaflow -m 0750 /etc/pegaflow' "$shim/calls" ||
  pf_fail "postinst: no /etc/pegaflow"
: >"$shim/calls"; touch "$shim/known"
PATH="$shim:$PATH" sh "$PF_TMP/control/postinst" configure || pf_fail "postinst (upgrade) failed"
! grep -q 'add' "$shim/calls" || pf_fail "postinst re-created an existing user: $(cat "$shim/calls")"
echo "ok: units and postinst"

# the units' command lines, as systemd runs them: EnvironmentFile, then ExecStart with $VARs
run_unit() { # unit-name log-name: starts it as pf_start LOG-NAME
  local name=$1 unit="$root/lib/systemd/system/$1.service"
  local envf exec
  envf=$(sed -n 's/^EnvironmentFile=-\{0,1\}//p' "$unit")
  exec=$(sed -n 's/^ExecStart=//p' "$unit")
  [ "$envf" = "/etc/default/$name" ] || pf_fail "$name.service reads '$envf', not /etc/default/$name"
  [ -n "$exec" ] || pf_fail "$name.service has no ExecStart"
  bash -n "$root$envf" || pf_fail "$envf does not parse"
  # shellcheck disable=SC1090
  local argv
  read -r -a argv <<<"$(set -a; . "$root$envf"; eval "echo $exec")"
  [ "${argv[0]}" = "/usr/bin/$name" ] || pf_fail "$name.service runs ${argv[0]}"
  argv[0]="$root${argv[0]}"
  echo "unit $name: ${argv[*]}"
  pf_start "$2" "${argv[@]}"
}
# the shipped files define the variables the units use (empty: built-in defaults)
grep -q '^PEGAFLOW_SERVER_ARGS=' "$root/etc/default/pegaflow-server" || pf_fail "no PEGAFLOW_SERVER_ARGS"
grep -q '^PEGAFLOW_METASERVER_ARGS=' "$root/etc/default/pegaflow-metaserver" || pf_fail "no PEGAFLOW_METASERVER_ARGS"
# an operator's edits (port 0 so the test never collides)
sed -i 's/^PEGAFLOW_SERVER_ARGS=.*/PEGAFLOW_SERVER_ARGS="--gpu-backend sim --pool-size 64mb --addr 127.0.0.1:0 --http-addr 127.0.0.1:0"/' \
  "$root/etc/default/pegaflow-server"
sed -i 's/^PEGAFLOW_METASERVER_ARGS=.*/PEGAFLOW_METASERVER_ARGS="--addr 127.0.0.1:0 --http-addr 127.0.0.1:0"/' \
  "$root/etc/default/pegaflow-metaserver"
run_unit pegaflow-server srv
run_unit pegaflow-metaserver meta
for s in srv meta; do
  g=$(pf_wait_port "$s" grpc) || pf_fail "$s did not listen"
  h=$(pf_wait_port "$s" http) || pf_fail "$s: no HTTP port"
  [ "$(curl -fsS "http://127.0.0.1:$h/health")" = ok ] || pf_fail "$s /health"
  if [ "$s" = srv ]; then
    [ "$("$root/usr/bin/pegaflow-cli" --addr "127.0.0.1:$g" health)" = ok ] || pf_fail "packaged cli: Health"
  fi
  pf_stop "$s" TERM || pf_fail "$s exited non-zero after SIGTERM (systemctl stop)"
done

# a client built with the pkg-config file against the unpacked header and library
cat >"$PF_TMP/v.c" <<'C'
#include <pegaflow.h>
#include <stdio.h>
int main(void) { puts(pf_client_version()); return 0; }
C
flags=$(PKG_CONFIG_SYSROOT_DIR="$root" PKG_CONFIG_LIBDIR="$root/usr/lib/$ma/pkgconfig" \
  pkg-config --cflags --libs pegaflow) || pf_fail "pkg-config pegaflow"
cc "$PF_TMP/v.c" -o "$PF_TMP/v" $flags || pf_fail "compile with pkg-config flags: $flags"
[ "$(LD_LIBRARY_PATH="$root/usr/lib/$ma" "$PF_TMP/v")" = "$version" ] || pf_fail "client version"
echo "ok: .deb"

# ---- wheel, into a clean venv, offline
"$PF_TOP/ci/mkwheel.sh" "$O" "$PF_TMP/pkg" >"$PF_TMP/mkwheel.log" 2>&1 || pf_fail "mkwheel"
whl=$(ls "$PF_TMP"/pkg/pegaflow_c-"$version"-*.whl) || pf_fail "no wheel"
"$py" -m venv --system-site-packages "$PF_TMP/venv" || pf_fail "venv"
"$PF_TMP/venv/bin/python" -m pip install -q --no-index --no-deps "$whl" >"$PF_TMP/pip.log" 2>&1 ||
  pf_fail "pip install $whl"
out=$(cd "$PF_TMP" && env -u PEGAFLOW_LIB -u PYTHONPATH "$PF_TMP/venv/bin/python" -c '
import sys, pegaflow.client._lib as l
lib = l.load_library()
print(lib.path)
print(lib.version())
print(l.__file__)') || pf_fail "import pegaflow in the venv: $out"
echo "$out"
path=$(sed -n 1p <<<"$out")
case "$path" in
  "$PF_TMP/venv/"*/site-packages/pegaflow/lib/libpegaflow.so) ;;
  *) pf_fail "the venv loaded libpegaflow from $path, not from the wheel" ;;
esac
[ "$(sed -n 2p <<<"$out")" = "$version" ] || pf_fail "wheel's library version"
case "$(sed -n 3p <<<"$out")" in "$PF_TMP/venv/"*) ;; *) pf_fail "imported pegaflow from outside the venv" ;; esac
echo "ok: wheel"
echo PASS
