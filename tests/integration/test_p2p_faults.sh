#!/usr/bin/env bash
# P2P failures with real processes, each node in its own network namespace (loopback without
# root): the holder killed mid-transfer, a transfer timeout (connection invalidated, lock
# force-released), a transfer lock expiring after the requester died, corruption in flight,
# eviction between discovery and fetch. Each ends in a correct partial or full miss, never
# wrong bytes, never a hang. See p2p_e2e.c.
exec bash "$(dirname "$0")/p2p_netns.sh" kill timeout expire corrupt evict "$@"
