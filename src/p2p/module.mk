# P2P: handshake, connection table, transfer locks, remote fetch (the "rdma" tier).
CORE_SRCS += $(wildcard src/p2p/*.c)
