# The runlog image: one image for every runlog process (`runlog gateway`,
# `runlog worker`, `runlog migrate`, `runlog prune`), chosen by the command.
# NATS and PostgreSQL run as their own official images (compose.yaml), so
# the `embedded` extra (bundled nats-server and PostgreSQL) is not installed.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# The source is copied, installed, then removed: the image runs the
# installed package, not a work tree (.dockerignore keeps the venv, tests
# and local data out of the build context).
COPY . /src
RUN pip install /src \
    && rm -rf /src \
    && useradd --system --uid 10001 --home-dir /var/lib/runlog --create-home runlog

# Nothing is written at run time but the (unused here) data folder.
USER runlog
WORKDIR /var/lib/runlog

# 8080: gateway (REST, SSE, WebSocket, /metrics, /healthz, /readyz).
# 9090: worker /metrics and /healthz (RUNLOG_WORKER_METRICS_PORT).
EXPOSE 8080 9090

# SIGTERM drains (gateways: clients told to resume elsewhere; workers:
# runs finished or handed over); exec form so runlog is PID 1 and gets it.
STOPSIGNAL SIGTERM
ENTRYPOINT ["runlog"]
CMD ["gateway"]
