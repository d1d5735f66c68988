CORE_SRCS += $(wildcard sim/gpu/*.c)
