"""compose.yaml and the Dockerfile, checked without a container engine.

No container engine runs here, so these tests hold the deployment files to
the code they deploy: every runlog service runs a real `runlog` subcommand
with real flags, every RUNLOG_* variable is a real setting with a value of
the right type, long-running services have health checks and restart
policies, the drain grace periods cover the drain settings, and the image
installs the project. The NATS and HAProxy configs are validated by the real
binaries where they are installed (nats-server always is: it is the
`embedded` extra).
"""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from broker.settings import ENV_PREFIX, Settings
from runlog.cli import _parser
from runlog.embedded import nats_server_binary

ROOT = Path(__file__).resolve().parent.parent
RUNLOG_IMAGE = "runlog:local"
SETTING_VARS = {ENV_PREFIX + f.name.upper(): f for f in dataclasses.fields(Settings)}
_INTERPOLATION = re.compile(r"\$\{(\w+)(?::?[-?])?([^}]*)\}")


def _compose() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((ROOT / "compose.yaml").read_text())
    return data


def _services() -> dict[str, dict[str, Any]]:
    services: dict[str, dict[str, Any]] = _compose()["services"]
    return services


def _runlog_services() -> dict[str, dict[str, Any]]:
    return {n: s for n, s in _services().items() if s.get("image") == RUNLOG_IMAGE}


def _default(value: str) -> str:
    """A compose value with `${VAR:-default}` replaced by its default (what
    a deployment that sets nothing gets); `${VAR:?msg}` by a placeholder."""

    def sub(m: re.Match[str]) -> str:
        whole = m.group(0)
        return "required-value" if ":?" in whole else m.group(2)

    return _INTERPOLATION.sub(sub, value)


def _seconds(duration: str) -> float:
    m = re.fullmatch(r"(\d+)(ms|s|m)", duration)
    assert m, f"unexpected duration {duration!r}"
    return int(m.group(1)) * {"ms": 0.001, "s": 1.0, "m": 60.0}[m.group(2)]


def test_the_expected_services_exist() -> None:
    services = _services()
    assert {"nats", "postgres", "migrate", "worker", "gateway"} <= set(services)
    assert set(_runlog_services()) >= {"migrate", "worker", "gateway"}
    for name, svc in _runlog_services().items():
        assert svc["build"]["dockerfile"] == "Dockerfile", name


@pytest.mark.parametrize("name", ["migrate", "worker", "gateway"])
def test_commands_are_real_runlog_subcommands(name: str) -> None:
    command = _runlog_services()[name]["command"]
    assert isinstance(command, list), "exec form: no shell between SIGTERM and runlog"
    try:
        args = _parser().parse_args(command)
    except SystemExit as e:
        pytest.fail(f"{name}: `runlog {' '.join(command)}` is not a valid command ({e})")
    assert args.command == command[0]


@pytest.mark.parametrize("name", sorted(_runlog_services()))
def test_every_runlog_variable_is_a_real_setting(name: str) -> None:
    env: dict[str, str] = _runlog_services()[name]["environment"]
    assert isinstance(env, dict)
    unknown = [k for k in env if k.startswith(ENV_PREFIX) and k not in SETTING_VARS]
    assert not unknown, f"{name} sets variables that are no setting: {unknown}"
    # Every value (its default, where interpolated) parses as its setting's type.
    values = {k: _default(str(v)) for k, v in env.items()}
    settings = Settings.from_env(values)
    assert settings.nats_url and settings.database_url
    assert "runlog-development-secret" not in settings.jwt_secret


def test_no_compose_interpolation_variable_looks_like_a_setting() -> None:
    # A RUNLOG_-prefixed name read only by compose would read as a setting.
    text = (ROOT / "compose.yaml").read_text()
    for var, _ in _INTERPOLATION.findall(text):
        if var.startswith(ENV_PREFIX):
            assert var in SETTING_VARS, f"${{{var}}} is not a setting: rename it"


def test_health_checks_restart_policies_and_dependencies() -> None:
    services = _services()
    for name, svc in services.items():
        assert "restart" in svc, f"{name} has no restart policy"
        if name == "migrate":
            assert svc["restart"] == "no"  # one-shot: dependants wait for its exit 0
            continue
        assert svc["restart"] in ("always", "unless-stopped", "on-failure"), name
        check = svc.get("healthcheck", {}).get("test")
        assert check, f"{name} has no health check"
    for name in ("worker", "gateway"):
        deps = services[name]["depends_on"]
        assert deps["migrate"]["condition"] == "service_completed_successfully"
        assert deps["nats"]["condition"] == "service_healthy"
        assert deps["postgres"]["condition"] == "service_healthy"
    assert services["migrate"]["depends_on"]["postgres"]["condition"] == "service_healthy"


def test_health_checks_hit_the_ports_the_processes_listen_on() -> None:
    services = _runlog_services()
    gw_env = services["gateway"]["environment"]
    gw_check = " ".join(services["gateway"]["healthcheck"]["test"])
    assert f":{gw_env['RUNLOG_GATEWAY_PORT']}/readyz" in gw_check
    assert gw_env["RUNLOG_GATEWAY_HOST"] == "0.0.0.0"
    wk_env = services["worker"]["environment"]
    wk_check = " ".join(services["worker"]["healthcheck"]["test"])
    assert f":{wk_env['RUNLOG_WORKER_METRICS_PORT']}/healthz" in wk_check
    # The worker's HTTP endpoint binds gateway_host: reachable from Prometheus.
    assert wk_env["RUNLOG_GATEWAY_HOST"] == "0.0.0.0"


def test_workers_and_gateways_scale_and_drain_within_their_grace_period() -> None:
    services = _runlog_services()
    defaults = Settings()
    for name, drain_var, drain_default, margin_s in (
        ("worker", "RUNLOG_DRAIN_TIMEOUT_S", defaults.drain_timeout_s, 10.0),
        ("gateway", "RUNLOG_GATEWAY_DRAIN_S", defaults.gateway_drain_s, 5.0),
    ):
        svc = services[name]
        # --scale N needs replicas that do not collide on a name or a host port.
        assert "container_name" not in svc, name
        for port in svc.get("ports", []):
            host = _default(str(port)).rsplit(":", 1)[0]
            assert "-" in host, f"{name}: a fixed host port {host} cannot be scaled"
        assert svc["stop_signal"] == "SIGTERM"
        drain_s = float(svc["environment"].get(drain_var, drain_default))
        assert _seconds(svc["stop_grace_period"]) >= drain_s + margin_s, name


def test_mounted_files_exist() -> None:
    for name, svc in _services().items():
        for volume in svc.get("volumes", []):
            source = str(volume).split(":", 1)[0]
            if source.startswith("./"):
                assert (ROOT / source).is_file(), f"{name} mounts missing {source}"


def test_dockerfile_installs_the_project() -> None:
    text = (ROOT / "Dockerfile").read_text()
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.startswith("#")]
    assert lines[0] == "FROM python:3.11-slim"
    assert re.search(r"^COPY \. (/src|\.)$", text, re.MULTILINE)
    assert re.search(r"^RUN pip install (/src|\.)\b", text, re.MULTILINE)
    assert 'ENTRYPOINT ["runlog"]' in text
    assert re.search(r"^USER \w+", text, re.MULTILINE), "run as a non-root user"
    # The build context (COPY .) keeps everything `pip install` needs.
    ignored = {
        ln.strip().rstrip("/")
        for ln in (ROOT / ".dockerignore").read_text().splitlines()
        if ln.strip() and not ln.startswith("#")
    }
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    needed = [*project["tool"]["setuptools"]["packages"], "pyproject.toml", "README.md"]
    assert not ignored & set(needed), ignored & set(needed)
    # The console's files are package data, so the installed gateway serves them.
    if (ROOT / "gateway" / "static").is_dir():
        assert "static/*" in project["tool"]["setuptools"]["package-data"]["gateway"]


def test_nats_config_keeps_the_documented_sync_interval() -> None:
    conf = (ROOT / "deploy" / "nats.conf").read_text()
    assert re.search(r'^\s*sync_interval:\s*"2m"', conf, re.MULTILINE)
    assert "store_dir: /data/jetstream" in conf
    nats = _services()["nats"]
    assert "nats-data:/data" in nats["volumes"]
    result = subprocess.run(
        [str(nats_server_binary()), "-t", "-c", str(ROOT / "deploy" / "nats.conf")],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    result = subprocess.run(
        [str(nats_server_binary()), "-t", "-c", str(ROOT / "deploy" / "nats-cluster.conf")],
        capture_output=True, text=True, check=False,
        env={**os.environ, "NATS_SERVER_NAME": "nats-1"},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
