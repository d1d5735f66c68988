CORE_SRCS += $(wildcard src/cache/*.c)
