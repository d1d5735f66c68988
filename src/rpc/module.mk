CORE_SRCS += $(wildcard src/rpc/*.c)
CLIENT_SRCS += src/rpc/client.c src/rpc/status.c src/rpc/auth.c src/rpc/wire_query.c
