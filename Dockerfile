# syntax=docker/dockerfile:1
# Build: docker build -t keyspread .
# Run:   docker run -p 8080:8080 -e KEYSPREAD_TOKEN=... -v keyspread-data:/data keyspread

FROM rust:1.95-slim-bookworm AS build
WORKDIR /src
# Dependencies first, so source edits reuse the cached dependency layer.
# The workspace's members are the server (the root), the crates in crates/ and the example
# producer: each gets an empty stand-in, so that only the dependencies are built in this
# layer.
COPY Cargo.toml Cargo.lock ./
COPY crates/keyspace/Cargo.toml crates/keyspace/
COPY crates/client/Cargo.toml crates/client/
COPY examples/mirror_producer/Cargo.toml examples/mirror_producer/
RUN mkdir -p src benches crates/keyspace/src crates/client/src examples/mirror_producer/src \
 && echo 'fn main() {}' > src/main.rs \
 && echo 'fn main() {}' > examples/mirror_producer/src/main.rs \
 && touch src/lib.rs crates/keyspace/src/lib.rs crates/client/src/lib.rs \
 && for bench in $(grep -A1 '^\[\[bench\]\]' Cargo.toml | sed -n 's/^name = "\(.*\)"$/\1/p'); do \
      echo 'fn main() {}' > "benches/$bench.rs"; done \
 && cargo build --release --locked \
 && rm -rf src benches crates/keyspace/src crates/client/src
COPY crates/keyspace/src ./crates/keyspace/src
COPY crates/client/src ./crates/client/src
COPY src ./src
COPY migrations ./migrations
COPY benches ./benches
RUN touch src/main.rs src/lib.rs crates/keyspace/src/lib.rs \
 && cargo build --release --locked --bin keyspread

FROM debian:bookworm-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --system --gid 10001 keyspread \
 && useradd --system --uid 10001 --gid keyspread --home-dir /data --no-create-home keyspread \
 && mkdir -p /data && chown keyspread:keyspread /data
COPY --from=build /src/target/release/keyspread /usr/local/bin/keyspread
USER keyspread:keyspread
WORKDIR /data
VOLUME ["/data"]
# Listening on every interface: mutations then need KEYSPREAD_TOKEN (or come from inside
# the container). The database lives on the volume. Probe GET /healthz and /readyz.
ENV KEYSPREAD_LISTEN=0.0.0.0:8080 \
    DATABASE_URL=sqlite:///data/keyspread.db \
    RUST_LOG=info
EXPOSE 8080
STOPSIGNAL SIGTERM
ENTRYPOINT ["keyspread"]
CMD ["serve"]
