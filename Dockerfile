# tether in a container: `docker build -t tether .` then
#   docker run -p 8787:8787 -v tether-data:/data tether
# Multi-stage: the release binary is built in the Rust image and copied into
# a slim Debian runtime, run as an unprivileged user with SQLite under /data.
# scripts/docker-smoke builds it and makes one call (scripts/test runs it when
# Docker answers).

FROM rust:1-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked -p tether \
    && install -m 0755 target/release/tether /usr/local/bin/tether

FROM debian:bookworm-slim
# curl for the HEALTHCHECK only; ca-certificates for HTTPS upstreams.
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates curl \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --system --uid 10001 --user-group --home-dir /data --shell /usr/sbin/nologin tether \
    && mkdir -p /data && chown tether:tether /data && chmod 0700 /data
COPY --from=build /usr/local/bin/tether /usr/local/bin/tether
USER tether
WORKDIR /data
VOLUME ["/data"]
ENV TETHER_LISTEN=0.0.0.0:8787 \
    TETHER_STORE=sqlite:/data/tether.db \
    TETHER_LOG_FORMAT=json
EXPOSE 8787
HEALTHCHECK --interval=10s --timeout=3s --start-period=5s --retries=3 \
    CMD curl -fsS http://127.0.0.1:8787/healthz || exit 1
STOPSIGNAL SIGTERM
ENTRYPOINT ["tether"]
CMD ["serve"]
