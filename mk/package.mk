# Packages (docs/server.md "Installing from packages").
#   make deb     $(O)/pkg/pegaflow_<version>_<arch>.deb   (ci/mkdeb.sh, dpkg-deb)
#   make wheel   $(O)/pkg/pegaflow_c-<version>-py3-none-linux_<machine>.whl with libpegaflow.so
#                inside (ci/mkwheel.sh, Debian's setuptools + wheel, offline)
PF_PKG_VERSION := $(shell sed -n 's/^\#define PF_VERSION "\(.*\)"/\1/p' src/include/pf/common.h)
PKG_DIR := $(O)/pkg
.PHONY: deb wheel packages
deb: all
	@ci/mkdeb.sh $(O) $(PF_PKG_VERSION) $(PKG_DIR)
wheel: $(LIBPEGAFLOW)
	@ci/mkwheel.sh $(O) $(PKG_DIR)
packages: deb wheel
