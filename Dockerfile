# Floodgate: build in the Rust image, run in a slim Debian.
#   docker build -t floodgate .
#   docker run -p 127.0.0.1:50051:50051 -p 127.0.0.1:8080:8080 \
#       -v $PWD/admin-tokens:/run/secrets/admin_tokens:ro \
#       -e FLOODGATE_ADMIN_TOKEN_FILE=/run/secrets/admin_tokens floodgate
# The container listens on every interface so that it can be reached at all;
# Admin answers nothing from outside it until FLOODGATE_ADMIN_TOKEN_FILE
# names a token file (or mTLS identities are given), and says so at start.
FROM rust:1-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked --bin floodgate

FROM debian:bookworm-slim
# A fixed UID, as deploy/kubernetes runs it (runAsUser: 10001).
RUN useradd --system --no-create-home --uid 10001 --user-group floodgate
COPY --from=build /src/target/release/floodgate /usr/local/bin/floodgate
USER 10001:10001
EXPOSE 50051 8080
ENTRYPOINT ["floodgate"]
# Inside a container, listen on every interface (the binary's default is loopback).
CMD ["serve", "--listen", "0.0.0.0:50051", "--http-listen", "0.0.0.0:8080"]
