ifeq ($(wildcard sim/net/tcpnet.c),)
CORE_SRCS += sim/net/tcpnet_absent.c
else
CORE_SRCS += $(filter-out sim/net/tcpnet_absent.c,$(wildcard sim/net/*.c))
endif
