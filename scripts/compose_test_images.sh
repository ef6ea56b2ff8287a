#!/usr/bin/env bash
# Build the images of the docker-compose stack on a machine that reaches Debian's package mirror
# and the Python package index but no container image registry (CI, the developers' machines):
#
#   execgate-base:bookworm        Debian bookworm made by debootstrap (python3, venv, pip, bubblewrap,
#                                 bash, git, ca-certificates), brought in with `docker import`
#   execgate-build-base:bookworm  the same plus gcc and libc6-dev, for the Dockerfile's build stage
#   execgate-build:offline        build-base plus a wheelhouse made on this host (execgate's build
#                                 and runtime dependencies) with pip told to use only it
#   execgate:dev                  the repository's Dockerfile built on those (BASE_IMAGE, BUILD_IMAGE)
#   execgate-redis:bookworm       base plus Debian's redis-server, the stack's Redis
#                                 (EXECGATE_REDIS_IMAGE; users get the public redis image)
#
# Nothing inside a container touches the network: the Debian mirror is used by debootstrap on the
# host (its URL read from this machine's apt sources, never written down here), and Python packages
# come from the host's pip configuration.
#
# The two Debian root filesystems are kept as tarballs in $EXECGATE_IMAGE_CACHE (default
# /var/cache/execgate-ci) under a key that hashes their recipe (suite, package lists, ROOTFS_RECIPE),
# so a rerun only imports them; a missing or partial cache means a fresh debootstrap (a few
# minutes). Bump ROOTFS_RECIPE when make_rootfs_tarballs changes what it puts in them. Redis's .deb
# files (fetched by apt in a chroot of the base) are kept there too, under a key that covers the
# base's.
#
# Usage: bash scripts/compose_test_images.sh      (root; dockerd running; debootstrap installed)
# Environment: PYTHON (the Python that runs pip; default .venv/bin/python, else python3),
#   EXECGATE_IMAGE_CACHE, EXECGATE_DEBIAN_MIRROR (overrides the mirror read from apt's sources).
set -euo pipefail
cd "$(dirname "$0")/.."

SUITE=bookworm
BASE_TAG=execgate-base:$SUITE
BUILD_BASE_TAG=execgate-build-base:$SUITE
BUILD_TAG=execgate-build:offline
IMAGE_TAG=execgate:dev
REDIS_TAG=execgate-redis:$SUITE
BASE_PACKAGES=python3,python3-venv,python3-pip,bubblewrap,bash,git,ca-certificates
BUILD_PACKAGES="gcc libc6-dev"
REDIS_PACKAGES="redis-server redis-tools"
ROOTFS_RECIPE=1
CACHE="${EXECGATE_IMAGE_CACHE:-/var/cache/execgate-ci}"
PYTHON="${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3)}"
export DOCKER_BUILDKIT=0  # the classic builder: no buildx plugin is needed

key="$(echo "$SUITE $BASE_PACKAGES $BUILD_PACKAGES $ROOTFS_RECIPE" | sha256sum | cut -c1-16)"
redis_key="$(echo "$key $REDIS_PACKAGES" | sha256sum | cut -c1-16)"
scratch=()  # temporary directories, removed on exit
trap 'rm -rf "${scratch[@]}"' EXIT
log() { printf 'compose-images: %s\n' "$*" >&2; }

debian_mirror() {
    # The Debian archive in this machine's apt sources (one-line or deb822 format): a `deb` source
    # of $SUITE's main component, else of any release's main (an archive mirror serves every
    # release; -security and -updates suites are other archives or partial ones).
    if [ -n "${EXECGATE_DEBIAN_MIRROR:-}" ]; then echo "$EXECGATE_DEBIAN_MIRROR"; return; fi
    "$PYTHON" - "$SUITE" /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources <<'PY'
import re, sys

def deb822(text):
    for block in re.split(r"\n\s*\n", text):
        fields, last = {}, None
        for line in block.splitlines():
            if line.startswith("#") or not line.strip():
                continue
            if line[0].isspace() and last:
                fields[last] += " " + line.strip()
            elif ":" in line:
                key, value = line.split(":", 1)
                last = key.strip().lower()
                fields[last] = value.strip()
        if "deb" in fields.get("types", "").split() and fields.get("enabled", "yes").lower() != "no":
            for uri in fields.get("uris", "").split()[:1]:
                for suite in fields.get("suites", "").split():
                    yield uri, suite, fields.get("components", "").split()

def one_line(text):
    for line in text.splitlines():
        words = re.sub(r"\[[^]]*\]", "", line.split("#", 1)[0]).split()
        if len(words) >= 4 and words[0] == "deb":
            yield words[1], words[2], words[3:]

want, sources = sys.argv[1], []
for path in sys.argv[2:]:
    try:
        text = open(path, encoding="utf-8").read()
    except OSError:
        continue
    sources += deb822(text) if path.endswith(".sources") else one_line(text)
main = [(uri, suite) for uri, suite, components in sources if "main" in components]
for uri, suite in sorted(main, key=lambda source: source[1] != want):
    if suite == want or ("-" not in suite and "/" not in suite):
        print(uri)
        sys.exit(0)
sys.exit(f"no Debian archive in the apt sources (set EXECGATE_DEBIAN_MIRROR to one serving {want})")
PY
}

image_key() {  # image [label]
    docker image inspect -f "{{ index .Config.Labels \"${2:-execgate.key}\" }}" "$1" 2>/dev/null || true
}

chroot_apt() {  # root apt-get-arguments...
    # apt-get in a chroot: the root's own apt sources (debootstrap wrote the mirror there), the
    # host's network; as root throughout (no _apt user switch), no pty for dpkg's log (no /dev/pts).
    chroot "$1" env DEBIAN_FRONTEND=noninteractive apt-get -qq -o APT::Sandbox::User=root \
        -o Dpkg::Use-Pty=0 "${@:2}"
}

import_rootfs() {  # tarball tag
    docker import --change "LABEL execgate.key=$key" --change 'ENV LANG=C.UTF-8' \
        --change 'CMD ["/bin/bash"]' "$1" "$2" >/dev/null
}

make_rootfs_tarballs() {
    local mirror root
    mirror="$(debian_mirror)"
    root="$(mktemp -d /var/tmp/execgate-rootfs-XXXXXX)"
    scratch+=("$root")
    log "debootstrap $SUITE into $root (packages: $BASE_PACKAGES)"
    debootstrap --variant=minbase --include="$BASE_PACKAGES" "$SUITE" "$root" "$mirror" \
        >"$CACHE/debootstrap.log" 2>&1 || { tail -20 "$CACHE/debootstrap.log" >&2; return 1; }
    rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
    tar -C "$root" --numeric-owner -cf "$CACHE/base-$key.tar.part" .
    log "adding $BUILD_PACKAGES for the build stage"
    cp /etc/resolv.conf "$root/etc/resolv.conf"
    chroot_apt "$root" update
    chroot_apt "$root" install -y --no-install-recommends $BUILD_PACKAGES >/dev/null
    chroot_apt "$root" clean
    rm -rf "$root"/var/lib/apt/lists/*
    : >"$root/etc/resolv.conf"
    tar -C "$root" --numeric-owner -cf "$CACHE/build-$key.tar.part" .
    mv "$CACHE/base-$key.tar.part" "$CACHE/base-$key.tar"
    mv "$CACHE/build-$key.tar.part" "$CACHE/build-$key.tar"
}

base_images() {
    if [ "$(image_key "$BASE_TAG")" = "$key" ] && [ "$(image_key "$BUILD_BASE_TAG")" = "$key" ]; then
        log "$BASE_TAG and $BUILD_BASE_TAG are current (key $key)"
        return
    fi
    mkdir -p "$CACHE"
    if [ ! -s "$CACHE/base-$key.tar" ] || [ ! -s "$CACHE/build-$key.tar" ]; then
        rm -f "$CACHE"/base-*.tar* "$CACHE"/build-*.tar*  # older keys: not needed any more
        make_rootfs_tarballs
    else
        log "root filesystems from the cache $CACHE (key $key)"
    fi
    import_rootfs "$CACHE/base-$key.tar" "$BASE_TAG"
    import_rootfs "$CACHE/build-$key.tar" "$BUILD_BASE_TAG"
}

build_image() {
    local wheels
    wheels="$(mktemp -d /var/tmp/execgate-wheels-XXXXXX)"
    scratch+=("$wheels")
    # Wheels for the image's Python (its version tag); pip evaluates environment markers with this
    # host's Python, though, so what the image's needs beyond it is named here: redis-py wants
    # async-timeout below Python 3.11.3 (bookworm has 3.11.2).
    local python_version
    python_version="$(docker run --rm --network none --entrypoint python3 "$BUILD_BASE_TAG" \
        -c 'import platform; print(platform.python_version())')"
    log "wheelhouse: execgate's dependencies (extras redis, web) and build backend for Python $python_version ($wheels)"
    "$PYTHON" -m pip download -q --only-binary=:all: --python-version "$python_version" -d "$wheels" \
        '.[redis,web]' 'setuptools>=77' 'async-timeout>=4.0.3'
    rm -f "$wheels"/execgate-*  # the image builds execgate itself, from the Dockerfile's context
    printf 'FROM %s\nCOPY . /wheelhouse\nENV PIP_NO_INDEX=1 PIP_FIND_LINKS=/wheelhouse\n' "$BUILD_BASE_TAG" \
        | docker build -q --force-rm -t "$BUILD_TAG" -f - "$wheels" >/dev/null
    log "docker build $IMAGE_TAG (BASE_IMAGE=$BASE_TAG BUILD_IMAGE=$BUILD_TAG)"
    docker build -q --force-rm --network none -t "$IMAGE_TAG" \
        --build-arg BASE_IMAGE="$BASE_TAG" --build-arg BUILD_IMAGE="$BUILD_TAG" . >/dev/null
}

redis_debs() {
    # Debian's redis-server and what it needs beyond the base image, as .deb files: apt in a chroot
    # of the base image's root filesystem (docker export), download only.
    local root container
    root="$(mktemp -d /var/tmp/execgate-redis-root-XXXXXX)"
    scratch+=("$root")
    log "fetching the .deb files of $REDIS_PACKAGES (apt in a chroot of $BASE_TAG)"
    container="$(docker create "$BASE_TAG")"
    docker export "$container" | tar -C "$root" -x
    docker rm "$container" >/dev/null
    cp /etc/resolv.conf "$root/etc/resolv.conf"
    chroot_apt "$root" update
    chroot_apt "$root" install -y --no-install-recommends --download-only $REDIS_PACKAGES >/dev/null
    rm -f "$CACHE"/redis-debs-*.tar*  # older keys
    (cd "$root/var/cache/apt/archives" && tar -cf "$CACHE/redis-debs-$redis_key.tar.part" ./*.deb)
    mv "$CACHE/redis-debs-$redis_key.tar.part" "$CACHE/redis-debs-$redis_key.tar"
}

redis_image() {
    if [ "$(image_key "$REDIS_TAG" execgate.redis-key)" = "$redis_key" ]; then
        log "$REDIS_TAG is current (key $redis_key)"
        return
    fi
    mkdir -p "$CACHE"
    if [ -s "$CACHE/redis-debs-$redis_key.tar" ]; then
        log "redis .deb files from the cache $CACHE (key $redis_key)"
    else
        redis_debs
    fi
    local context
    context="$(mktemp -d /var/tmp/execgate-redis-XXXXXX)"
    scratch+=("$context")
    tar -C "$context" -xf "$CACHE/redis-debs-$redis_key.tar"
    # policy-rc.d: dpkg starts no service while it configures the packages.
    cat >"$context/Dockerfile" <<DOCKERFILE
FROM $BASE_TAG
COPY *.deb /tmp/debs/
RUN printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d && chmod 755 /usr/sbin/policy-rc.d \\
 && dpkg -i /tmp/debs/*.deb >/dev/null && rm -rf /tmp/debs /usr/sbin/policy-rc.d && redis-server --version
LABEL execgate.redis-key=$redis_key
USER redis
WORKDIR /var/lib/redis
EXPOSE 6379
CMD ["redis-server", "--protected-mode", "no"]
DOCKERFILE
    log "docker build $REDIS_TAG"
    docker build -q --force-rm --network none -t "$REDIS_TAG" "$context" >/dev/null
}

time_of() {  # label command...
    local start=$SECONDS
    "${@:2}"
    log "$1: $((SECONDS - start)) s"
}

time_of "base images" base_images
time_of "execgate image" build_image
time_of "redis image" redis_image
# Earlier builds' images and build stages, all derived from the base images (their label).
docker image prune -f --filter label=execgate.key >/dev/null
docker image ls --format '{{.Repository}}:{{.Tag}} {{.Size}}' | grep -E '^execgate' >&2
