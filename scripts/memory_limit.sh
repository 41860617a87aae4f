#!/usr/bin/env bash
# Run a command under a memory limit, as an 8 GB laptop would hold it to what is free:
#   scripts/memory_limit.sh 4G COMMAND [ARGS...]
# systemd-run's scope where systemd runs; else a cgroup made for the command (root): in cgroup v2,
# or v1's memory controller, under the caller's own cgroup, so any limit above it still holds.
# Exits with the command's status (137: killed by the limit); the folder is removed afterwards.
set -euo pipefail
limit=$1
shift
if systemd-run --scope -q -p MemoryMax="$limit" true 2>/dev/null; then
  exec systemd-run --scope -q -p MemoryMax="$limit" -p MemorySwapMax=0 "$@"
fi
if [ -f /sys/fs/cgroup/cgroup.controllers ]; then  # v2 only
  group=/sys/fs/cgroup$(awk -F: '$1 == "0" {print $3}' /proc/self/cgroup)/specedge-limit-$$
  mkdir "$group"
  echo "$limit" > "$group/memory.max"
  echo 0 > "$group/memory.swap.max" 2>/dev/null || true
elif [ -d /sys/fs/cgroup/memory ]; then  # v1
  group=/sys/fs/cgroup/memory$(awk -F: '$2 == "memory" {print $3}' /proc/self/cgroup)/specedge-limit-$$
  mkdir "$group"
  echo "$limit" > "$group/memory.limit_in_bytes"
  echo "$limit" > "$group/memory.memsw.limit_in_bytes" 2>/dev/null || true
else
  echo "memory_limit.sh: no systemd and no cgroup memory controller here" >&2
  exit 2
fi
trap 'rmdir "$group" 2>/dev/null || true' EXIT
status=0
bash -c 'echo $$ > "$1/cgroup.procs" && shift && exec "$@"' limit "$group" "$@" || status=$?
if [ -f "$group/memory.max_usage_in_bytes" ]; then  # v1: the group's peak, page cache included
  echo "memory_limit.sh: peak $(($(cat "$group/memory.max_usage_in_bytes") / 1048576)) MiB of $limit" >&2
elif [ -f "$group/memory.peak" ]; then
  echo "memory_limit.sh: peak $(($(cat "$group/memory.peak") / 1048576)) MiB of $limit" >&2
fi
exit "$status"
