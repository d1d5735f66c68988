#!/usr/bin/env bash
# P2P end to end with real processes, each node in its own network namespace (loopback
# without root): byte-exact fetch (Loading -> Ready), reuse of connections in both directions,
# wait_for_full_prefix, simultaneous mutual fetches, three nodes, the MetaServer killed and
# restarted (issue 4's two-server scenario with real servers), and the issue 15 layouts (MLA
# page-first, layer-split, hybrid groups) across nodes, and issue 24's tier plan (pure miss at
# once, honest tier counts, own SSD first, second holder, a stopped peer vs an SSD hit), and issue 25's SSD restart (a node's recovered
# blocks fetched by a peer). See
# p2p_e2e.c.
exec bash "$(dirname "$0")/p2p_netns.sh" basic mutual three metaserver layouts plan ssdrestart "$@"
