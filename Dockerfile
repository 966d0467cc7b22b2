# Reveille in a container: the wheel built from this checkout, on a slim Python, as a
# non-root user, with its state in a volume. Build and run (README, "Install and run as a
# service"):
#   docker build -t reveille .
#   docker run --init --stop-timeout 60 -p 127.0.0.1:8642:8642 -p 127.0.0.1:8787:8787 \
#     -e API_SERVER_KEY=... -e REVEILLE_WEBUI_PASSWORD=... -v reveille-home:/var/lib/reveille reveille
# It listens on 0.0.0.0 inside the container, which the server allows only with
# API_SERVER_KEY set (and the web UI only with REVEILLE_WEBUI_PASSWORD, or
# REVEILLE_WEBUI_PORT=0): without them it refuses to start and says why.

FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY agent ./agent
COPY api ./api
COPY delivery ./delivery
COPY gateway ./gateway
COPY reveille ./reveille
COPY storage ./storage
COPY tools ./tools
# `reveille --version` names this commit: docker build --build-arg REVEILLE_COMMIT=$(git rev-parse HEAD)
ARG REVEILLE_COMMIT=unknown
RUN printf '%s\n' "$REVEILLE_COMMIT" > reveille/BUILD_COMMIT
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /dist .

FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    REVEILLE_HOME=/var/lib/reveille \
    REVEILLE_HOST=0.0.0.0 \
    REVEILLE_PORT=8642 \
    REVEILLE_WEBUI_PORT=8787
# A fixed uid, so a volume's files keep their owner across image rebuilds; the state
# directory 0700 (the server refuses one others can read).
RUN groupadd --system --gid 10001 reveille \
    && useradd --system --uid 10001 --gid reveille --home-dir /var/lib/reveille \
       --shell /usr/sbin/nologin reveille \
    && install -d -m 0700 -o reveille -g reveille /var/lib/reveille
COPY --from=build /dist/ /tmp/dist/
# The [otel] extra: traces are then one OTEL_EXPORTER_OTLP_ENDPOINT away.
RUN pip install --no-cache-dir "$(ls /tmp/dist/reveille-*.whl)[otel]" && rm -rf /tmp/dist
USER reveille
WORKDIR /var/lib/reveille
VOLUME ["/var/lib/reveille"]
EXPOSE 8642 8787
# Ready = storage reachable and not draining (a draining server answers 503).
HEALTHCHECK --interval=15s --timeout=5s --start-period=20s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen(f\"http://127.0.0.1:{os.environ.get('REVEILLE_PORT', '8642')}/readyz\", timeout=4)"]
# SIGTERM drains (drain_seconds, default 30): give the container more than that to stop.
STOPSIGNAL SIGTERM
CMD ["reveille", "serve"]
