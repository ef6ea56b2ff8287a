# One image for every service of the dev stack (docker-compose.yml): the policy service, the
# sandboxed agent runner and the optional terminal approver.
#
# Two stages: `build` compiles the preload shim and the native wrapper into a wheel (it needs gcc);
# the final image installs that wheel and carries no compiler. BASE_IMAGE lets a machine without a
# registry build on a locally made Debian image with Python 3.11 (e.g. from debootstrap).
ARG BASE_IMAGE=python:3.11-slim-bookworm

FROM ${BASE_IMAGE} AS build
RUN apt-get update \
 && apt-get install -y --no-install-recommends gcc libc6-dev \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY pyproject.toml setup.py README.md LICENSE ./
COPY protos ./protos
COPY server ./server
COPY policy_service ./policy_service
COPY wrapper ./wrapper
RUN python3 -m pip wheel --no-cache-dir --no-deps -w /wheels .

FROM ${BASE_IMAGE}
RUN apt-get update \
 && apt-get install -y --no-install-recommends bubblewrap bash git ca-certificates \
 && rm -rf /var/lib/apt/lists/*
COPY --from=build /wheels /wheels
RUN python3 -m pip install --no-cache-dir /wheels/*.whl && rm -rf /wheels && execgate --version

# The sockets shared between containers live in this volume.
VOLUME ["/run/execgate"]
ENTRYPOINT ["execgate"]
CMD ["--help"]
