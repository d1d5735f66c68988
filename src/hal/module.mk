CORE_SRCS += $(wildcard src/hal/*.c)
