# One image for every execgate service of the dev stack (docker-compose.yml): the policy service
# replicas, the sandboxed agent runner and the web approver (and the terminal approver). It carries
# the `redis` and `web` extras (`policy serve --state redis://…`, `execgate approve --web`).
#
# Two stages: `build` compiles the preload shim and the native wrapper into a wheel and collects
# the wheels of its dependencies (it needs gcc); the final image installs those wheels, offline,
# into a virtualenv (/opt/execgate) and carries no compiler (tests/e2e/test_run_compose.py checks).
#
# BASE_IMAGE / BUILD_IMAGE let a machine without an image registry build on local Debian images
# that already hold the packages below (scripts/compose_test_images.sh makes them with debootstrap
# and gives the build stage a wheelhouse); the apt-get steps run only when something is missing.
# The default is the public Python image:
#   docker build -t execgate:dev .
ARG BASE_IMAGE=python:3.11-slim-bookworm
ARG BUILD_IMAGE=${BASE_IMAGE}

FROM ${BUILD_IMAGE} AS build
RUN command -v gcc >/dev/null && [ -e /usr/include/stdio.h ] || { apt-get update \
 && apt-get install -y --no-install-recommends gcc libc6-dev \
 && rm -rf /var/lib/apt/lists/*; }
WORKDIR /src
COPY pyproject.toml setup.py README.md LICENSE ./
COPY protos ./protos
COPY server ./server
COPY policy_service ./policy_service
COPY wrapper ./wrapper
RUN python3 -m pip wheel --no-cache-dir -w /wheels '.[redis,web]'

FROM ${BASE_IMAGE}
RUN command -v bwrap >/dev/null && command -v git >/dev/null && [ -e /etc/ssl/certs/ca-certificates.crt ] \
 || { apt-get update \
 && apt-get install -y --no-install-recommends bubblewrap bash git ca-certificates \
 && rm -rf /var/lib/apt/lists/*; }
COPY --from=build /wheels /wheels
# A virtualenv: Debian's own python3 refuses system-wide pip installs (PEP 668).
RUN python3 -m venv /opt/execgate \
 && /opt/execgate/bin/pip install --no-cache-dir --no-index --find-links /wheels 'execgate[redis,web]' \
 && rm -rf /wheels
ENV PATH=/opt/execgate/bin:$PATH
RUN execgate --version && python3 -c 'import aiohttp, redis'

# Every service runs as one unprivileged user: the sockets are 0600 and shared between containers,
# and bubblewrap builds the agent's sandbox in a user namespace, which root without CAP_SYS_ADMIN
# cannot do (bwrap(1): as real root it does not make a user namespace unless asked).
RUN useradd --uid 1000 --user-group --create-home execgate \
 && install -d -o execgate -g execgate -m 0700 /run/execgate /var/log/execgate
USER execgate
# The Unix sockets shared between containers (the replicas' approvals endpoints, reached by the web
# approver) live in this volume (a fresh named volume takes the owner and mode of the directory
# above); the policy service's audit log in the second one.
VOLUME ["/run/execgate", "/var/log/execgate"]
ENTRYPOINT ["execgate"]
CMD ["--help"]
