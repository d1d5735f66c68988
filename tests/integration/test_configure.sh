#!/usr/bin/env bash
# The build configures after packages arrive: in a scratch copy of the tree,
# 1. a first configure on a machine "without rdma-core" (a compiler wrapper that cannot
#    see infiniband/verbs.h or libibverbs) writes HAVE_VERBS := 0;
# 2. once the packages "arrive" (the wrapper sees them again) the next make reconfigures
#    by itself and HAVE_VERBS becomes 1; an unchanged machine does not reconfigure;
# 3. options given to ./configure (--without-verbs) survive the automatic reruns;
# 4. `make test` runs ci/install-deps.sh before anything is configured;
# 5. ci/check-backends.sh names the backends a build contains and fails when
#    libibverbs-dev is installed but the build has no verbs backend.
set -euo pipefail
top=${PF_TOP:?PF_TOP must name the repository (make test sets it)}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/pf-configure.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

real_cc=$(command -v "${CC:-cc}")
printf '#include <infiniband/verbs.h>\nint main(void){return ibv_get_device_list(0)!=0;}\n' >"$tmp/p.c"
if ! "$real_cc" "$tmp/p.c" -o "$tmp/p" -libverbs >/dev/null 2>&1; then
  echo "SKIP: libibverbs-dev is not installed here, so packages cannot be made to 'arrive'"
  exit 77
fi

# the compiler wrapper: with $tmp/no-rdma present it behaves as if rdma-core were absent
mkdir -p "$tmp/bin"
cat >"$tmp/bin/cc" <<W
#!/usr/bin/env bash
if [ -e "$tmp/no-rdma" ]; then
  for a in "\$@"; do
    case "\$a" in
      -libverbs|-print-file-name=libibverbs*) [ "\${a#-print-file-name=}" != "\$a" ] && { echo libibverbs.so; exit 0; }
                  echo "cc: cannot find -libverbs" >&2; exit 1 ;;
    esac
    if [ -f "\$a" ] && grep -q 'infiniband/verbs.h' "\$a"; then
      echo "\$a: fatal error: infiniband/verbs.h: No such file or directory" >&2; exit 1
    fi
  done
fi
exec "$real_cc" "\$@"
W
chmod +x "$tmp/bin/cc"

src="$tmp/src"
mkdir -p "$src"
tar -C "$top" --exclude=./build --exclude=.git -cf - . | tar -C "$src" -xf -
printf 'include mk/config.mk\nshow:\n\t@echo HAVE_VERBS=$(HAVE_VERBS)\n' >"$src/show.mk"
show() { (cd "$src" && CC="$tmp/bin/cc" make --no-print-directory -f show.mk show 2>&1); }

touch "$tmp/no-rdma"
out=$(show)
echo "$out"
grep -qx 'HAVE_VERBS=0' <<<"$out" || fail "first configure without rdma-core: $out"
grep -qx 'HAVE_VERBS := 0' "$src/build/config.mk" || fail "config.mk: $(cat "$src/build/config.mk")"

rm "$tmp/no-rdma" # the packages arrive
out=$(show)
echo "$out"
grep -q 'reconfiguring' <<<"$out" || fail "no reconfigure after the packages arrived: $out"
grep -qx 'HAVE_VERBS=1' <<<"$out" || fail "HAVE_VERBS after the packages arrived: $out"
out=$(show)
grep -q 'reconfiguring' <<<"$out" && fail "reconfigured although nothing changed: $out"
grep -qx 'HAVE_VERBS=1' <<<"$out" || fail "HAVE_VERBS on a second run: $out"

(cd "$src" && CC="$tmp/bin/cc" ./configure --without-verbs >/dev/null)
touch "$tmp/no-rdma"
out=$(show)
grep -q 'reconfiguring' <<<"$out" || fail "no reconfigure after rdma-core went away: $out"
grep -qx 'HAVE_VERBS=0' <<<"$out" || fail "HAVE_VERBS with --without-verbs: $out"
rm "$tmp/no-rdma"
out=$(show)
grep -qx 'HAVE_VERBS=0' <<<"$out" || fail "--without-verbs lost on an automatic rerun: $out"
grep -qx 'CONFIGURE_ARGS := --without-verbs' "$src/build/config.mk" || fail "CONFIGURE_ARGS not recorded"
echo "ok: configure reruns when the probes' inputs change and keeps its options"

# make test: install-deps runs before any configure (the fake one stops make there)
rm -rf "$src/build"
cat >"$src/ci/install-deps.sh" <<'D'
#!/usr/bin/env bash
if [ -e build/config.mk ]; then echo "DEPS-AFTER-CONFIGURE"; else echo "DEPS-BEFORE-CONFIGURE"; fi
exit 3
D
chmod +x "$src/ci/install-deps.sh"
out=$(cd "$src" && CC="$tmp/bin/cc" make --no-print-directory test 2>&1 || true)
head -n 5 <<<"$out"
grep -q 'DEPS-BEFORE-CONFIGURE' <<<"$out" || fail "make test configured before installing packages: $out"
echo "ok: make test installs before it configures"

# check-backends reads the build: an archive without verbs.o while libibverbs-dev is installed
mkdir -p "$tmp/O/lib" "$tmp/fakebin"
: >"$tmp/verbs_absent.o"
: >"$tmp/cuda_absent.o"
ar rcs "$tmp/O/lib/libpfcore.a" "$tmp/verbs_absent.o" "$tmp/cuda_absent.o"
cat >"$tmp/fakebin/dpkg-query" <<'Q'
#!/bin/sh
echo 'install ok installed'
Q
chmod +x "$tmp/fakebin/dpkg-query"
set +e
out=$(PATH="$tmp/fakebin:$PATH" CUDA_HOME="$tmp/nocuda" "$top/ci/check-backends.sh" "$tmp/O" 2>&1)
rc=$?
set -e
echo "$out"
[ $rc -eq 1 ] || fail "check-backends passed a build without verbs while libibverbs-dev is installed (rc $rc)"
grep -q '^backends: cuda no, verbs no' <<<"$out" || fail "no backends line: $out"
grep -q 'libibverbs-dev is installed but hw/verbs was not built' <<<"$out" || fail "message: $out"
out=$(PATH="$tmp/fakebin:$PATH" CUDA_HOME="$tmp/nocuda" CONFIGURE_ARGS=--without-verbs \
  "$top/ci/check-backends.sh" "$tmp/O" 2>&1) || fail "--without-verbs is a choice, not an error: $out"
: >"$tmp/verbs.o"
ar rcs "$tmp/O/lib/libpfcore.a" "$tmp/verbs.o"
out=$(PATH="$tmp/fakebin:$PATH" CUDA_HOME="$tmp/nocuda" "$top/ci/check-backends.sh" "$tmp/O" 2>&1) ||
  fail "a build with verbs.o refused: $out"
grep -q '^backends: cuda no, verbs yes' <<<"$out" || fail "backends line with verbs: $out"
echo "ok: check-backends"
echo PASS
