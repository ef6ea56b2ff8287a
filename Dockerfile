# One image for every service of the dev stack (docker-compose.yml): the policy service, the
# sandboxed agent runner and the optional terminal approver. A C compiler is needed at install time:
# `pip install` builds the preload shim and the native wrapper.
FROM python:3.11-slim-bookworm

RUN apt-get update \
 && apt-get install -y --no-install-recommends gcc libc6-dev bubblewrap bash git ca-certificates \
 && rm -rf /var/lib/apt/lists/*

WORKDIR /opt/execgate
COPY pyproject.toml setup.py README.md ./
COPY protos ./protos
COPY server ./server
COPY policy_service ./policy_service
COPY wrapper ./wrapper
RUN pip install --no-cache-dir . && execgate --version

# The sockets shared between containers live in this volume.
VOLUME ["/run/execgate"]
ENTRYPOINT ["execgate"]
CMD ["--help"]
