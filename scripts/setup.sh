#!/usr/bin/env bash
# Set up execgate on a fresh Debian machine: the system tools it and its tests use (bubblewrap,
# shells, a C compiler for the preload shim and native wrapper, a 32-bit toolchain (gcc-multilib) for
# the shim's i386 build, busybox-static and Go for the seccomp backstop's tests, headless Chromium and
# its WebDriver for the approval page's browser test, a Docker engine and debootstrap for the compose
# stack's test, redis-server for the replicated policy service's tests, npm, ssh and man-db for the
# agent-work tests (tests/e2e/test_run_agent_work.py), …), then a virtualenv `.venv`
# (or $EXECGATE_VENV) with execgate and its test dependencies installed.
set -euo pipefail
cd "$(dirname "$0")/.."

# package:command pairs; a package is installed only when its command is missing.
need=(bubblewrap:bwrap zsh:zsh dash:dash bash:bash strace:strace make:make perl:perl curl:curl
      git:git gcc:gcc libc6-dev:/usr/include/stdio.h findutils:find docker-compose:docker-compose
      acl:setfacl util-linux:setpriv passwd:useradd docker.io:dockerd debootstrap:debootstrap
      chromium:/usr/bin/chromium chromium-driver:/usr/bin/chromedriver
      gcc-multilib:/usr/lib32/crt1.o busybox-static:busybox golang-go:go
      redis-server:redis-server npm:npm openssh-client:ssh man-db:man
      manpages:/usr/share/man/man7/man.7.gz)
missing=()
for pair in "${need[@]}"; do
    pkg="${pair%%:*}" cmd="${pair#*:}"
    if [[ "$cmd" == /* ]]; then [ -e "$cmd" ] || missing+=("$pkg")
    else command -v "$cmd" >/dev/null 2>&1 || missing+=("$pkg"); fi
done
if [ "${#missing[@]}" -gt 0 ]; then
    if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1; then
        echo "setup: installing ${missing[*]}"
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -qq
        apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
    else
        echo "setup: missing system packages: ${missing[*]} (install them, e.g. with apt-get)" >&2
    fi
fi

VENV="${EXECGATE_VENV:-.venv}"
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip
"$VENV/bin/python" -m pip install -q ".[test]"
echo "setup: execgate installed in $VENV ($("$VENV/bin/execgate" --version))"
