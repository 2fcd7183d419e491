"""Reading the deploy files: the compose file, the Kubernetes manifests, the Dockerfile."""

from __future__ import annotations

import functools
import importlib.util
import re
import shlex
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import yaml

REPO_ROOT = Path(__file__).resolve().parents[2]
DEPLOY = REPO_ROOT / "deploy"
K8S = DEPLOY / "k8s"
DOCKERFILE = DEPLOY / "Dockerfile"
COMPOSE_FILE = DEPLOY / "compose.yaml"
DEPLOY_DOC = REPO_ROOT / "docs" / "deploy.md"
HEALTHCHECK_SCRIPT = DEPLOY / "healthcheck.py"
APPARMOR = DEPLOY / "apparmor"
ENV_EXAMPLE = DEPLOY / ".env.example"

TOOLQ_IMAGE = "toolq"
KUSTOMIZATION = "kustomization.yaml"
EXAMPLE_SECRET = "secret.example.yaml"
#: Kinds of KEDA's CRDs, whose schemas the Kubernetes validator does not have.
KEDA_KINDS = ("ScaledObject", "TriggerAuthentication")

Manifest = dict[str, Any]


def image_name(image: str) -> str:
    """``registry/toolq:0.1.0`` -> ``toolq``."""
    return image.rsplit("/", 1)[-1].split("@")[0].split(":")[0]


# -- compose -----------------------------------------------------------------------------------


@functools.cache
def compose() -> Manifest:
    loaded: Manifest = yaml.safe_load(COMPOSE_FILE.read_text())
    return loaded


def services() -> dict[str, Manifest]:
    """The services that keep running; not the one-shot ones (``one_shot_services``)."""
    return {
        name: service
        for name, service in compose()["services"].items()
        if str(service.get("restart")) != "no"
    }


def one_shot_services() -> dict[str, Manifest]:
    """Services that run once before the others (``restart: "no"``): the fleet secret's."""
    return {
        name: service
        for name, service in compose()["services"].items()
        if str(service.get("restart")) == "no"
    }


def toolq_services() -> dict[str, Manifest]:
    return {
        name: service
        for name, service in services().items()
        if image_name(service.get("image", "")) == TOOLQ_IMAGE
    }


def service_networks(service: Manifest) -> list[str]:
    networks = service.get("networks", [])
    return list(networks) if isinstance(networks, dict) else networks


def service_environment(service: Manifest) -> dict[str, str]:
    environment = service.get("environment", {})
    if isinstance(environment, list):
        return dict(item.split("=", 1) for item in environment)
    return {key: str(value) for key, value in environment.items()}


_INTERPOLATION = re.compile(r"\$\{(?P<name>\w+)(?:(?P<op>:-|:\?)(?P<arg>[^}]*))?\}")


def interpolated(value: str) -> str:
    """The value compose would use with nothing set: each ``${...}`` in it replaced by its
    default, or by ``<NAME>`` for a required one."""

    def replacement(match: re.Match[str]) -> str:
        return match["arg"] if match["op"] == ":-" else f"<{match['name']}>"

    return _INTERPOLATION.sub(replacement, value)


def required_variable(value: str) -> str | None:
    """``NAME`` when ``value`` is exactly ``${NAME:?message}`` (compose refuses to start without
    it), else None."""
    match = _INTERPOLATION.fullmatch(value)
    return match["name"] if match is not None and match["op"] == ":?" and match["arg"] else None


def duration_s(value: str) -> float:
    """A compose duration (``10m30s``, ``90s``) in seconds."""
    units = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001, "us": 0.000_001}
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|us|h|m|s)", value)
    if not parts or "".join(number + unit for number, unit in parts) != value:
        raise ValueError(f"not a compose duration: {value!r}")
    return sum(float(number) * units[unit] for number, unit in parts)


# -- Kubernetes --------------------------------------------------------------------------------


def k8s_files() -> list[Path]:
    return sorted(path for path in K8S.glob("*.yaml") if path.name != KUSTOMIZATION)


@functools.cache
def _manifests() -> tuple[tuple[str, Manifest], ...]:
    return tuple(
        (path.name, document)
        for path in k8s_files()
        for document in yaml.safe_load_all(path.read_text())
        if document
    )


def manifests() -> list[tuple[str, Manifest]]:
    return list(_manifests())


def kustomization() -> Manifest:
    loaded: Manifest = yaml.safe_load((K8S / KUSTOMIZATION).read_text())
    return loaded


def objects(kind: str) -> dict[str, Manifest]:
    return {doc["metadata"]["name"]: doc for _, doc in _manifests() if doc["kind"] == kind}


def deployment(name: str) -> Manifest:
    return objects("Deployment")[name]


def pod_spec(deployment_name: str) -> Manifest:
    spec: Manifest = deployment(deployment_name)["spec"]["template"]["spec"]
    return spec


def pod_labels(deployment_name: str) -> dict[str, str]:
    labels: dict[str, str] = deployment(deployment_name)["spec"]["template"]["metadata"]["labels"]
    return labels


def containers(deployment_name: str) -> list[Manifest]:
    found: list[Manifest] = pod_spec(deployment_name)["containers"]
    return found


def toolq_deployments() -> list[str]:
    return [
        name
        for name in objects("Deployment")
        if any(image_name(c["image"]) == TOOLQ_IMAGE for c in containers(name))
    ]


def config_map_data() -> dict[str, str]:
    data: dict[str, str] = objects("ConfigMap")["toolq-config"]["data"]
    return data


def container_env(deployment_name: str) -> list[Manifest]:
    """The ``env`` entries of a deployment's first container, in their order."""
    entries: list[Manifest] = containers(deployment_name)[0].get("env", [])
    return entries


def container_environment(deployment_name: str) -> dict[str, str]:
    """Literal variables a deployment's first container gets: its ConfigMaps, then its env."""
    container = containers(deployment_name)[0]
    environment: dict[str, str] = {}
    for source in container.get("envFrom", []):
        if "configMapRef" in source:
            environment.update(objects("ConfigMap")[source["configMapRef"]["name"]]["data"])
    for variable in container.get("env", []):
        if "value" in variable:
            environment[variable["name"]] = variable["value"]
    return environment


def selects(selector: Manifest, labels: dict[str, str]) -> bool:
    """Whether a label selector (matchLabels only) selects a pod with ``labels``."""
    if "matchExpressions" in selector:
        raise AssertionError("matchExpressions are not checked by these tests; use matchLabels")
    return all(labels.get(key) == value for key, value in selector.get("matchLabels", {}).items())


# -- Dockerfile --------------------------------------------------------------------------------


def dockerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined, comments dropped."""
    lines = [
        line
        for line in DOCKERFILE.read_text().splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]
    joined = re.sub(r"\\\n", " ", "\n".join(lines))
    instructions = []
    for line in joined.splitlines():
        keyword, _, arguments = line.strip().partition(" ")
        instructions.append((keyword.upper(), arguments.strip()))
    return instructions


def dockerfile_assignments(keyword: str) -> dict[str, str]:
    """Every name set by ENV or ARG (``ARG NAME`` without a default maps to "")."""
    assigned: dict[str, str] = {}
    for instruction, arguments in dockerfile_instructions():
        if instruction != keyword:
            continue
        for token in shlex.split(arguments):
            name, _, value = token.partition("=")
            assigned[name] = value
    return assigned


# -- docs --------------------------------------------------------------------------------------


def shell_lines(markdown: str) -> Iterator[list[str]]:
    """The commands in a Markdown file's ``sh`` code blocks, each split into words."""
    for block in re.findall(r"```sh\n(.*?)```", markdown, flags=re.DOTALL):
        for line in re.sub(r"\\\n", " ", block).splitlines():
            words = shlex.split(line, comments=True)
            if words:
                yield words


def invocations(words: list[str], program: str) -> Iterator[list[str]]:
    """Arguments of each ``program`` run in a command line (not a value such as ``-n toolq``)."""
    stops = {"|", "||", "&&", ";", "&", ">", ">>"}
    for index, word in enumerate(words):
        previous = words[index - 1] if index else ""
        if word != program or index + 1 == len(words):
            continue
        if previous.startswith("-") and previous != "--":
            continue
        arguments: list[str] = []
        for following in words[index + 1 :]:
            if following in stops:
                break
            arguments.append(following)
        yield arguments


# -- the image's health check ------------------------------------------------------------------


@functools.cache
def healthcheck_module() -> ModuleType:
    """deploy/healthcheck.py, which is a script in the image rather than a package module."""
    spec = importlib.util.spec_from_file_location("toolq_healthcheck", HEALTHCHECK_SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
