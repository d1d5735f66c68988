CORE_SRCS += $(wildcard hw/uring/*.c)
