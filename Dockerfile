# syntax=docker/dockerfile:1
# Floodgate: built in the Rust image, run in a slim Debian.
#   docker build -t floodgate:0.5.0 .
#   docker run -p 127.0.0.1:50051:50051 -p 127.0.0.1:8080:8080 \
#       -v $PWD/admin-tokens:/run/secrets/admin_tokens:ro \
#       -e FLOODGATE_ADMIN_TOKEN_FILE=/run/secrets/admin_tokens floodgate:0.5.0
# The container listens on every interface so that it can be reached at all;
# Admin answers nothing from outside it until FLOODGATE_ADMIN_TOKEN_FILE
# names a token file (or mTLS identities are given), and says so at start.
#
# The base images are pinned: the Rust toolchain to the version the project
# is tested with, Debian to its major release (its point releases carry
# security fixes). To pin further, replace a tag with its digest
# (`rust:1.95.0-bookworm@sha256:...`).
FROM rust:1.95.0-bookworm AS build
WORKDIR /src
COPY . .
# BuildKit keeps the downloaded crates and the compiled dependencies in cache
# mounts between builds, so a change to Floodgate's own code recompiles only
# Floodgate's crates. The binary is copied out of the cached target directory,
# because a cache mount is not part of the image.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/usr/local/cargo/git \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked --bin floodgate \
    && cp target/release/floodgate /usr/local/bin/floodgate

FROM debian:12-slim
# A fixed UID, as deploy/kubernetes runs it (runAsUser: 10001).
RUN useradd --system --no-create-home --uid 10001 --user-group floodgate
COPY --from=build /usr/local/bin/floodgate /usr/local/bin/floodgate
USER 10001:10001
EXPOSE 50051 8080
ENTRYPOINT ["floodgate"]
# Inside a container, listen on every interface (the binary's default is loopback).
CMD ["serve", "--listen", "0.0.0.0:50051", "--http-listen", "0.0.0.0:8080"]
