# hw/verbs: compiled whenever ./configure found libibverbs (HAVE_VERBS=1).
ifeq ($(HAVE_VERBS)$(wildcard hw/verbs/verbs.c),1hw/verbs/verbs.c)
CORE_SRCS += $(filter-out hw/verbs/verbs_absent.c,$(wildcard hw/verbs/*.c))
else
CORE_SRCS += hw/verbs/verbs_absent.c
endif
