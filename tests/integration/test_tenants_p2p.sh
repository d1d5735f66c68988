#!/usr/bin/env bash
# Tenants across nodes: equal block hashes in two tenants' namespaces, each fetched over the
# TCP fabric byte-exact (the "tenants" scenario of p2p_e2e.c, p2p_tenants.h).
exec bash "$(dirname "$0")/p2p_netns.sh" tenants "$@"
