# tether in a container: `docker build -t tether .` then
#   docker run -p 8787:8787 -v tether-data:/data tether
# The release binary is built in the Rust image (stage `build`) and copied into
# a slim Debian runtime (stage `runtime-base`), run as an unprivileged user
# (uid 10001) with SQLite under /data. `runtime` (the last stage, what a plain
# `docker build .` makes) takes the binary from `build`; `runtime-prebuilt`
# takes a binary built outside, the file `tether` at the root of the build
# context (built on Debian 12 or an older glibc):
#   mkdir ctx && cp target/release/tether ctx/
#   docker build -f Dockerfile --target runtime-prebuilt -t tether ctx
# Both share runtime-base, so they differ only in where the binary comes from;
# BuildKit and Buildah/Podman skip the stages a target does not need.
# Podman: build with `--format docker`, the OCI format has no HEALTHCHECK.
# The runtime stage's apt-get needs the network at build time.
# scripts/docker-smoke builds runtime-prebuilt from target/release/tether with
# Docker or Podman and tries it (scripts/test runs it); the test command does
# not run the `build` stage.

FROM rust:1-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked -p tether \
    && install -m 0755 target/release/tether /usr/local/bin/tether

FROM debian:bookworm-slim AS runtime-base
# curl for the HEALTHCHECK only; ca-certificates for HTTPS upstreams (the
# system's roots are the ones trusted).
RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends ca-certificates curl \
    && apt-get clean && rm -rf /var/lib/apt/lists/* \
    && useradd --system --uid 10001 --user-group --home-dir /data --shell /usr/sbin/nologin tether \
    && mkdir -p /data && chown tether:tether /data && chmod 0700 /data
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

FROM runtime-base AS runtime-prebuilt
COPY tether /usr/local/bin/tether

FROM runtime-base AS runtime
COPY --from=build /usr/local/bin/tether /usr/local/bin/tether
