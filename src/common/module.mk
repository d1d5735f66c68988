COMMON_SRCS := $(wildcard src/common/*.c)
CORE_SRCS += $(COMMON_SRCS)
CLIENT_SRCS += $(COMMON_SRCS)
