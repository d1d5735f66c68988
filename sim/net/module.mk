# sim/net: the TCP fabric ("tcp" NET backend), always compiled.
CORE_SRCS += $(wildcard sim/net/*.c)
