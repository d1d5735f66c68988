CORE_SRCS += $(wildcard src/engine/*.c)
