CORE_SRCS += $(wildcard src/http/*.c)
