CORE_SRCS += $(wildcard src/app/*.c)
