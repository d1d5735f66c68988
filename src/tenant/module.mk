CORE_SRCS += $(wildcard src/tenant/*.c)
