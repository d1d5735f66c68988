# Runs ./configure when build/config.mk is missing or older than configure, then includes it.
CONFIG_MK := build/config.mk
ifeq ($(filter clean distclean format help,$(MAKECMDGOALS)),)
$(CONFIG_MK): configure
	@./configure
-include $(CONFIG_MK)
endif
HAVE_CUDA ?= 0
HAVE_VERBS ?= 0
