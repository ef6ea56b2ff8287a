#!/usr/bin/env bash
# Start the Docker engine when none answers: CI machines and fresh developer machines have Debian's
# docker.io installed (scripts/setup.sh) but no init system that starts it. dockerd runs in the
# background in its own session, its output in $EXECGATE_DOCKERD_LOG (default
# /var/log/execgate-ci/dockerd.log); this waits up to 60 s for `docker info` to answer.
set -euo pipefail

if docker info >/dev/null 2>&1; then
    echo "dockerd: already running"
    exit 0
fi
# A machine whose processes were all ended keeps the pid files; if such a pid now belongs to another
# program, dockerd (or the containerd it supervises) takes it for a running instance and waits on it.
for pair in dockerd:/var/run/docker.pid containerd:/var/run/docker/containerd/containerd.pid; do
    name="${pair%%:*}" file="${pair#*:}"
    if [ -s "$file" ] && [ "$(cat "/proc/$(cat "$file")/comm" 2>/dev/null)" != "$name" ]; then
        rm -f "$file"
    fi
done
log="${EXECGATE_DOCKERD_LOG:-/var/log/execgate-ci/dockerd.log}"
mkdir -p "$(dirname "$log")"
echo "== dockerd started $(date -u +%FT%TZ)" >>"$log"
setsid dockerd >>"$log" 2>&1 </dev/null &
pid=$!
for _ in $(seq 120); do
    if docker info >/dev/null 2>&1; then
        echo "dockerd: running (pid $pid, log $log)"
        exit 0
    fi
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.5
done
echo "dockerd: did not come up; the end of $log:" >&2
tail -20 "$log" >&2
exit 1
