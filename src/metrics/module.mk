CORE_SRCS += $(wildcard src/metrics/*.c)
