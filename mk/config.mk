# Runs ./configure when build/config.mk is missing, older than configure, or written from
# other probe inputs (CONFIG_FINGERPRINT differs from `./configure --fingerprint`, e.g.
# rdma-core was installed since), then includes it. Reruns keep the recorded options
# (CONFIGURE_ARGS). Goals that install packages first (test, run, coverage, deps) do not
# configure at this level: their recipes run ci/install-deps.sh and then a sub-make that
# configures with the packages in place.
CONFIG_MK := build/config.mk
CONFIGURE = CC='$(CC)' CPPFLAGS='$(CPPFLAGS)' LDFLAGS='$(LDFLAGS)' ./configure
CONFIG_GOALS := $(if $(MAKECMDGOALS),$(filter-out test run coverage deps,$(MAKECMDGOALS)),all)
ifeq ($(filter clean distclean format help,$(MAKECMDGOALS))$(if $(CONFIG_GOALS),,none),)
$(CONFIG_MK): configure
	@$(CONFIGURE) $(CONFIGURE_ARGS)
-include $(CONFIG_MK)
ifneq ($(wildcard $(CONFIG_MK)),)
ifneq ($(CONFIG_FINGERPRINT),$(shell $(CONFIGURE) --fingerprint $(CONFIGURE_ARGS)))
$(info configure: the backends' packages changed since $(CONFIG_MK) was written; reconfiguring)
$(shell $(CONFIGURE) $(CONFIGURE_ARGS) >&2)
include $(CONFIG_MK)
endif
endif
endif
HAVE_CUDA ?= 0
HAVE_VERBS ?= 0
