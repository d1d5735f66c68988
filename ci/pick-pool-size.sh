#!/usr/bin/env bash
# Prints a pinned-pool size that fits this machine: 1gb, or a quarter of the available
# memory when that is less (never below 64mb).
avail_kb=$(awk '/^MemAvailable:/ {print $2}' /proc/meminfo 2>/dev/null || echo 4194304)
quarter_mb=$(( avail_kb / 4 / 1024 ))
if [ "$quarter_mb" -ge 1024 ]; then echo 1gb
elif [ "$quarter_mb" -lt 64 ]; then echo 64mb
else echo "${quarter_mb}mb"; fi
