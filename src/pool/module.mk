CORE_SRCS += $(wildcard src/pool/*.c)
