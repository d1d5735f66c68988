#!/usr/bin/env bash
# Builds pegaflow_<version>_<arch>.deb with dpkg-deb (make deb):
#   ci/mkdeb.sh <build-dir> <version> <out-dir>
# Contents: /usr/bin/{pegaflow-server,pegaflow-metaserver,pegaflow-cli};
# /usr/lib/<multiarch>/libpegaflow.so, /usr/include/pegaflow/pegaflow.h and
# /usr/lib/<multiarch>/pkgconfig/pegaflow.pc; systemd units for both servers reading
# /etc/default/pegaflow-{server,metaserver} (conffiles); man pages made from --help.
# Depends: the Debian packages that provide the shared libraries the ELF files need, at
# least the versions installed here.
set -euo pipefail
O=${1:?build dir} version=${2:?version} out=${3:?out dir}
top=$(cd "$(dirname "$0")/.." && pwd)
arch=$(dpkg --print-architecture)
multiarch=$(dpkg-architecture -qDEB_HOST_MULTIARCH 2>/dev/null || gcc -print-multiarch)
root="$out/deb-root"
deb="$out/pegaflow_${version}_${arch}.deb"
rm -rf "$root"
mkdir -p "$root/DEBIAN" "$root/usr/bin" "$root/usr/lib/$multiarch/pkgconfig" \
  "$root/usr/include/pegaflow" "$root/lib/systemd/system" "$root/etc/default" \
  "$root/usr/share/man/man1" "$root/usr/share/doc/pegaflow"

for b in pegaflow-server pegaflow-metaserver pegaflow-cli; do
  install -m 755 "$O/bin/$b" "$root/usr/bin/$b"
  strip --strip-unneeded "$root/usr/bin/$b"
done
install -m 644 "$O/lib/libpegaflow.so" "$root/usr/lib/$multiarch/libpegaflow.so"
strip --strip-unneeded "$root/usr/lib/$multiarch/libpegaflow.so"
install -m 644 "$top/src/client/pegaflow.h" "$root/usr/include/pegaflow/pegaflow.h"
sed -e "s|@MULTIARCH@|$multiarch|" -e "s|@VERSION@|$version|" "$top/packaging/pegaflow.pc.in" \
  >"$root/usr/lib/$multiarch/pkgconfig/pegaflow.pc"
for s in pegaflow-server pegaflow-metaserver; do
  install -m 644 "$top/packaging/systemd/$s.service" "$root/lib/systemd/system/$s.service"
  install -m 644 "$top/packaging/debian/$s.default" "$root/etc/default/$s"
  "$top/ci/help2man.sh" "$O/bin/$s" "$s" "$version" | gzip -9n >"$root/usr/share/man/man1/$s.1.gz"
done
install -m 644 "$top/README.md" "$root/usr/share/doc/pegaflow/README.md"
for d in server metaserver metrics p2p ssd connector; do
  install -m 644 "$top/docs/$d.md" "$root/usr/share/doc/pegaflow/$d.md"
done
printf 'pegaflow (PegaFlow-C) %s\nLicense: Apache-2.0\n' "$version" >"$root/usr/share/doc/pegaflow/copyright"
printf '/etc/default/pegaflow-server\n/etc/default/pegaflow-metaserver\n' >"$root/DEBIAN/conffiles"
# the dedicated user the units run as (User=pegaflow) and /etc/pegaflow for secrets
install -m 755 "$top/packaging/debian/postinst" "$root/DEBIAN/postinst"

# the packages providing every shared library a shipped ELF file needs
declare -A deps=()
for f in "$root"/usr/bin/* "$root/usr/lib/$multiarch/libpegaflow.so"; do
  for so in $(objdump -p "$f" | awk '/NEEDED/ {print $2}'); do
    # (no early exit in the readers: a writer killed by SIGPIPE fails the pipe under pipefail)
    path=$(ldconfig -p | awk -v s="$so" '$1 == s && /x86-64|64bit|AArch64/ && !p {p = $NF} END {print p}')
    [ -n "$path" ] || { echo "mkdeb: $f needs $so, which ldconfig does not know" >&2; exit 1; }
    pkg=
    for p in "$path" "$(readlink -f "$path")" "${path#/usr}" "$(readlink -f "$path" | sed 's|^/usr||')"; do
      pkg=$(dpkg -S "$p" 2>/dev/null | sed -n '1s/:.*//p') && [ -n "$pkg" ] && break
    done
    [ -n "$pkg" ] || { echo "mkdeb: no Debian package provides $path ($so, needed by $f)" >&2; exit 1; }
    deps[$pkg]=1
  done
done
depends=
for p in $(printf '%s\n' "${!deps[@]}" | sort); do
  depends+="${depends:+, }$p (>= $(dpkg-query -W -f='${Version}' "$p" | sed 's/-[^-]*$//'))"
done
size=$(du -sk --exclude=DEBIAN "$root" | cut -f1)
cat >"$root/DEBIAN/control" <<C
Package: pegaflow
Version: $version
Architecture: $arch
Maintainer: PegaFlow-C developers <pegaflow@localhost>
Installed-Size: $size
Depends: $depends
Section: misc
Priority: optional
Homepage: https://github.com/novitalabs/pegaflow
Description: KV-cache storage engine for LLM inference (PegaFlow-C)
 pegaflow-server keeps vLLM KV-cache blocks in pinned host memory, spills them to
 SSD and shares them across nodes; pegaflow-metaserver is the cross-node block
 registry. Also ships libpegaflow (the C client library used by the Python
 connector, with header and pkg-config file) and systemd units reading
 /etc/default/pegaflow-server and /etc/default/pegaflow-metaserver.
C
mkdir -p "$out"
dpkg-deb --root-owner-group -Zxz --build "$root" "$deb" >/dev/null
echo "deb: $deb"
