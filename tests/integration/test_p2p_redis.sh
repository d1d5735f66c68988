#!/usr/bin/env bash
# P2P with the MetaServer on Redis (issue 14): two MetaServer replicas on one redis-server,
# nodes listing both; byte-exact fetch, a replica killed, Redis killed and back. See the
# "redis" scenario in p2p_e2e.c. Needs Debian's redis-server (exit 77 without it).
if ! command -v redis-server >/dev/null 2>&1; then
  echo "SKIP: redis-server not installed (ci/install-deps.sh installs redis-server)"
  exit 77
fi
exec bash "$(dirname "$0")/p2p_netns.sh" redis "$@"
