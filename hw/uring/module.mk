ifeq ($(wildcard hw/uring/uring.c),)
CORE_SRCS += hw/uring/uring_absent.c
else
CORE_SRCS += $(filter-out hw/uring/uring_absent.c,$(wildcard hw/uring/*.c))
endif
