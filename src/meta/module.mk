# MetaServer: store + gRPC service (pegaflow-metaserver) and the server-side client.
CORE_SRCS += $(wildcard src/meta/*.c)
