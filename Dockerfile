# Floodgate: build in the Rust image, run in a slim Debian.
#   docker build -t floodgate .
#   docker run -p 50051:50051 -p 8080:8080 floodgate
FROM rust:1-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked --bin floodgate

FROM debian:bookworm-slim
RUN useradd --system --no-create-home floodgate
COPY --from=build /src/target/release/floodgate /usr/local/bin/floodgate
USER floodgate
EXPOSE 50051 8080
ENTRYPOINT ["floodgate"]
# Inside a container, listen on every interface (the binary's default is loopback).
CMD ["serve", "--listen", "0.0.0.0:50051", "--http-listen", "0.0.0.0:8080"]
