CORE_SRCS += $(wildcard src/ssd/*.c)
