# syntax=docker/dockerfile:1
#
# changegate container image: a static, CGO-free binary on distroless, run as
# the non-root user 65532.
#
#   docker build -t changegate --build-arg VERSION=$(git describe --tags --always) .
#   docker run --rm -v $PWD/config.toml:/etc/changegate/config.toml:ro \
#       -e MONGODB_URI=... -p 9464:9464 changegate
#
# The last stage (changegate) is the default target. The "receiver" target is
# a small webhook receiver for deploy/compose.yaml and tests (not for
# production).
#
# No HEALTHCHECK: the distroless image has no shell or curl. Probe the admin
# server instead: GET /healthz (process alive) and GET /readyz (streams open,
# checkpoints fresh, sinks delivering) on port 9464, as deploy/kubernetes does.

# The go directive in go.mod (1.26.x) must not be newer than this image's Go,
# or the build would try to download a toolchain. For reproducible builds pin
# the digest: golang:1.26-bookworm@sha256:...
ARG GO_IMAGE=golang:1.26-bookworm
ARG RUNTIME_IMAGE=gcr.io/distroless/static-debian12:nonroot

FROM --platform=$BUILDPLATFORM ${GO_IMAGE} AS build
WORKDIR /src
ENV CGO_ENABLED=0 GOTOOLCHAIN=local GOFLAGS=-buildvcs=false
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod go mod download
COPY . .
ARG VERSION=dev
ARG TARGETOS
ARG TARGETARCH
RUN --mount=type=cache,target=/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
    GOOS=$TARGETOS GOARCH=$TARGETARCH \
    go build -trimpath -ldflags "-s -w -X main.version=${VERSION}" -o /out/changegate ./cmd/changegate && \
    GOOS=$TARGETOS GOARCH=$TARGETARCH \
    go build -trimpath -ldflags "-s -w" -o /out/receiver ./test/cmd/receiver

# Test webhook receiver: verifies Standard Webhooks signatures with the
# secret(s) in $WEBHOOK_SECRET and prints every envelope on stdout.
FROM ${RUNTIME_IMAGE} AS receiver
COPY --from=build /out/receiver /receiver
USER 65532:65532
EXPOSE 8080
ENTRYPOINT ["/receiver"]
CMD ["-listen", ":8080", "-path", "/hook"]

# The gateway (default target). distroless/static has CA certificates,
# tzdata and /etc/passwd with nonroot (65532); nothing else.
FROM ${RUNTIME_IMAGE} AS changegate
ARG VERSION=dev
LABEL org.opencontainers.image.title="changegate" \
      org.opencontainers.image.description="MongoDB change streams to webhooks, EventBridge and SQS" \
      org.opencontainers.image.source="https://github.com/changegate/changegate" \
      org.opencontainers.image.version="${VERSION}"
COPY --from=build /out/changegate /changegate
USER 65532:65532
# Admin server ([server].listen): /metrics, /healthz, /readyz, /api/v1/...
EXPOSE 9464
ENTRYPOINT ["/changegate"]
CMD ["run", "-config", "/etc/changegate/config.toml"]
