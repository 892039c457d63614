"""The team deployment file: docker-compose.temporal.yml is complete, pinned and wired as the README says.

Parsed with ruamel.yaml; when a docker client with the compose plugin is present, `docker compose config -q`
validates it as well (that part is simply not run where there is no docker compose).
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from ruamel.yaml import YAML

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.temporal.yml"

SERVICES = {"postgresql", "temporal-admin-tools", "temporal", "temporal-create-namespace", "temporal-ui", "bso-worker"}


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return YAML(typ="safe").load(COMPOSE.read_text())


def _env(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        return dict(item.split("=", 1) for item in env)
    return {str(k): str(v) for k, v in env.items()}


def _ports(service: dict[str, Any]) -> list[str]:
    return [str(p) for p in service.get("ports") or []]


def _command_text(service: dict[str, Any]) -> str:
    command = service.get("command") or []
    return command if isinstance(command, str) else "\n".join(map(str, command))


def test_every_service_is_there(compose: dict[str, Any]) -> None:
    assert set(compose["services"]) >= SERVICES


def test_images_are_pinned_and_auto_setup_is_not_used(compose: dict[str, Any]) -> None:
    for name, service in compose["services"].items():
        image = service.get("image")
        if "build" in service:
            continue  # the worker is built from the repository
        assert image, f"{name} has neither image nor build"
        repo, _, tag = image.rpartition(":")
        assert repo and tag, f"{name}: image {image!r} has no tag"
        assert tag != "latest", f"{name}: image {image!r} is not pinned"
        assert tag[0].isdigit(), f"{name}: image {image!r} should carry a version tag"
        assert "auto-setup" not in image, f"{name}: the deprecated auto-setup image is used"
    images = {name: s.get("image", "") for name, s in compose["services"].items()}
    assert images["postgresql"].startswith("postgres:16")
    assert images["temporal"].startswith("temporalio/server:")
    assert images["temporal-admin-tools"].startswith("temporalio/admin-tools:")
    assert images["temporal-create-namespace"].startswith("temporalio/admin-tools:")
    assert images["temporal-ui"].startswith("temporalio/ui:")
    # the schema job must match the server's version
    assert images["temporal"].split(":")[1] == images["temporal-admin-tools"].split(":")[1]


def test_ports(compose: dict[str, Any]) -> None:
    services = compose["services"]
    assert "7233:7233" in _ports(services["temporal"])
    assert "8080:8080" in _ports(services["temporal-ui"])


def test_healthchecks(compose: dict[str, Any]) -> None:
    services = compose["services"]
    pg_check = " ".join(map(str, services["postgresql"]["healthcheck"]["test"]))
    assert "pg_isready" in pg_check
    server_check = " ".join(map(str, services["temporal"]["healthcheck"]["test"]))
    assert "cluster health" in server_check


def test_postgres_has_a_named_volume(compose: dict[str, Any]) -> None:
    named = set(compose.get("volumes") or {})
    mounts = [str(v).split(":")[0] for v in compose["services"]["postgresql"].get("volumes") or []]
    assert any(m in named for m in mounts), f"postgresql mounts {mounts}, named volumes {named}"


def test_schema_job_sets_up_both_databases(compose: dict[str, Any]) -> None:
    script = _command_text(compose["services"]["temporal-admin-tools"])
    assert "temporal-sql-tool" in script
    for db in ("temporal", "temporal_visibility"):
        assert "--db $$db" in script or f"--db {db}" in script
    assert "temporal_visibility" in script
    for step in ("create", "setup-schema", "update-schema"):
        assert step in script
    assert "postgresql/v12/temporal/versioned" in script
    assert "postgresql/v12/visibility/versioned" in script


def test_server_uses_postgres12(compose: dict[str, Any]) -> None:
    env = _env(compose["services"]["temporal"])
    assert env["DB"] == "postgres12"
    assert env["POSTGRES_SEEDS"] == "postgresql"


def test_namespace_job_creates_namespace_and_search_attributes(compose: dict[str, Any]) -> None:
    script = _command_text(compose["services"]["temporal-create-namespace"])
    assert "namespace create" in script and "default" in script
    for attribute in ("BsoSessionId=Keyword", "BsoBatchId=Int", "BsoPhase=Keyword"):
        assert attribute in script


def test_depends_on_conditions(compose: dict[str, Any]) -> None:
    services = compose["services"]

    def cond(service: str, on: str) -> str:
        return services[service]["depends_on"][on]["condition"]

    assert cond("temporal-admin-tools", "postgresql") == "service_healthy"
    assert cond("temporal", "temporal-admin-tools") == "service_completed_successfully"
    assert cond("temporal-create-namespace", "temporal") == "service_healthy"
    assert cond("temporal-ui", "temporal") == "service_healthy"
    assert cond("bso-worker", "temporal") == "service_healthy"
    assert cond("bso-worker", "temporal-create-namespace") == "service_completed_successfully"


def test_worker_is_built_from_the_repository(compose: dict[str, Any]) -> None:
    worker = compose["services"]["bso-worker"]
    build = worker["build"]
    context = build if isinstance(build, str) else build.get("context", ".")
    dockerfile = "Dockerfile" if isinstance(build, str) else build.get("dockerfile", "Dockerfile")
    assert (ROOT / context / dockerfile).is_file()
    assert _env(worker)["TEMPORAL_ADDRESS"] == "temporal:7233"
    text = (ROOT / context / dockerfile).read_text()
    assert "FROM python:3.11-slim" in text
    assert "workers.main" in text
    assert (ROOT / ".dockerignore").is_file()


def _docker_compose_available() -> bool:
    if shutil.which("docker") is None:
        return False
    try:
        done = subprocess.run(["docker", "compose", "version"], capture_output=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


def test_docker_compose_config_accepts_the_file() -> None:
    """`docker compose config -q` where a docker client with compose exists; elsewhere only the parse checks run."""
    if not _docker_compose_available():
        return
    done = subprocess.run(
        ["docker", "compose", "-f", str(COMPOSE), "config", "-q"],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )
    assert done.returncode == 0, done.stderr
