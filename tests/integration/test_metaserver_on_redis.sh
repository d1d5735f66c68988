#!/usr/bin/env bash
# test_metaserver.sh with the MetaServer on Redis (--store redis://, a redis-server started
# by the test on a free loopback port): the memory store's process-level behaviour, same
# scenario, other store. Needs Debian's redis-server (exit 77 without it).
if ! command -v redis-server >/dev/null 2>&1 || ! command -v redis-cli >/dev/null 2>&1; then
  echo "SKIP: redis-server/redis-cli not installed (ci/install-deps.sh installs redis-server)"
  exit 77
fi
PF_META_STORE=redis exec bash "$(dirname "$0")/test_metaserver.sh" "$@"
