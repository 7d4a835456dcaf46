# syntax=docker/dockerfile:1
# tidegate: build wheels for the package and its dependencies in one stage, install them
# offline into a clean slim image in the next; the runtime needs no network and no compiler.

ARG PYTHON_IMAGE=python:3.11.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY router ./router
COPY policies ./policies
COPY tidegate ./tidegate
RUN pip wheel --no-cache-dir --wheel-dir /wheels .

FROM ${PYTHON_IMAGE}
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
# DL3013 (pin pip versions) does not apply: --no-index installs exactly the wheels built
# above from this repository, so the versions are fixed by the build stage.
# hadolint ignore=DL3013
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    pip install --no-cache-dir --no-index --find-links=/wheels tidegate \
    && useradd --system --uid 10001 --no-create-home --shell /usr/sbin/nologin tidegate
USER 10001:10001
# Config from a mounted file (the Helm chart mounts its ConfigMap here); secrets from env.
VOLUME ["/etc/tidegate"]
EXPOSE 8000
HEALTHCHECK --interval=10s --timeout=3s --start-period=10s --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/healthz', timeout=2)"]
ENTRYPOINT ["tidegate", "serve"]
CMD ["--config", "/etc/tidegate/tidegate.yaml"]
