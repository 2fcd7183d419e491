"""The deploy files: valid, locked down, and consistent with the code and settings they run."""

from __future__ import annotations

import copy
import importlib.resources
import json
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import jsonschema
import kubernetes_validate
import pytest
import typer
import typer.main
from celery import Celery
from celery.app.utils import find_app

from api.settings import OrchestratorSettings
from tests.deploy import deployfiles as files
from worker.contract.settings import WorkerSettings, setting_names
from worker.contract.settings_check import known_variables
from worker.contract.wire import AGENTS_QUEUE, POOLS

K8S_VERSION = "1.30"
SANDBOX = "worker-sandbox"
TOOLS = "worker-tools"
AGENTS = "worker-agents"
#: What a toolq worker may serve: the tool pools, and the agents queue of conversations.
SERVED = (*POOLS, AGENTS_QUEUE)
SECRET_VARIABLES = ("TOOLQ_API_TOKEN", "OPENAI_API_KEY")
SECRET_NAME = re.compile(r"TOKEN|SECRET|PASSW|API_KEY|CREDENTIAL|PRIVATE", re.IGNORECASE)
TOOLQ_VARIABLE = re.compile(r"\bTOOLQ_[A-Z0-9_]*[A-Z0-9]\b")

#: Redis's password: required by compose, a key of this Secret on Kubernetes.
REDIS_PASSWORD = "REDIS_PASSWORD"
REDIS_SECRET = "toolq-redis"
#: What the pools' workers may do as root in their user namespace, and nothing more.
POOL_CAPABILITIES = {
    SANDBOX: {"SETUID", "SETGID", "CHOWN", "FOWNER", "KILL", "SYS_ADMIN", "DAC_OVERRIDE"},
    TOOLS: {"CHOWN", "DAC_OVERRIDE", "FOWNER"},
}
#: The uids a pod with hostUsers: false (or a container under Docker's userns-remap) maps.
MAPPED_UIDS = range(0, 65536)
#: uids a run must never take: the image's user, and nobody.
RESERVED_UIDS = (10001, 65534)
APPARMOR_PROFILE = "toolq-sandbox"
#: The fleet secret's volume, as every long-running toolq container mounts it.
FLEET_SECRET_MOUNT = "fleet-secret:/var/lib/toolq/fleet:ro"


def keda_schema(kind: str, spec: dict[str, Any]) -> dict[str, Any]:
    """A KEDA object of ``kind``, named in a namespace, whose spec ``spec`` describes."""
    return {
        "type": "object",
        "required": ["apiVersion", "kind", "metadata", "spec"],
        "properties": {
            "apiVersion": {"const": "keda.sh/v1alpha1"},
            "kind": {"const": kind},
            "metadata": {
                "type": "object",
                "required": ["name", "namespace"],
                "properties": {"name": {"type": "string"}, "namespace": {"type": "string"}},
            },
            "spec": {"type": "object", "additionalProperties": False, **spec},
        },
    }


# KEDA's CRD schema is not available offline: these are the fields of its objects the files use.
SCALED_OBJECT_SCHEMA = keda_schema(
    "ScaledObject",
    {
        "required": ["scaleTargetRef", "triggers"],
        "properties": {
            "scaleTargetRef": {
                "type": "object",
                "required": ["name"],
                "additionalProperties": False,
                "properties": {
                    "name": {"type": "string"},
                    "kind": {"const": "Deployment"},
                    "apiVersion": {"const": "apps/v1"},
                },
            },
            "minReplicaCount": {"type": "integer", "minimum": 0},
            "maxReplicaCount": {"type": "integer", "minimum": 1},
            "pollingInterval": {"type": "integer", "minimum": 1},
            "cooldownPeriod": {"type": "integer", "minimum": 0},
            "advanced": {"type": "object"},
            "triggers": {
                "type": "array",
                "minItems": 1,
                "items": {
                    "type": "object",
                    "required": ["type", "metadata"],
                    "additionalProperties": False,
                    "properties": {
                        "type": {"const": "redis"},
                        "authenticationRef": {"type": "object"},
                        # KEDA takes every trigger metadata value as a string.
                        "metadata": {
                            "type": "object",
                            "required": ["address", "listName", "listLength"],
                            "additionalProperties": {"type": "string"},
                        },
                    },
                },
            },
        },
    },
)
TRIGGER_AUTHENTICATION_SCHEMA = keda_schema(
    "TriggerAuthentication",
    {
        "required": ["secretTargetRef"],
        "properties": {
            "secretTargetRef": {
                "type": "array",
                "minItems": 1,
                "items": {
                    "type": "object",
                    "required": ["parameter", "name", "key"],
                    "additionalProperties": False,
                    "properties": {
                        "parameter": {"type": "string"},
                        "name": {"type": "string"},
                        "key": {"type": "string"},
                    },
                },
            }
        },
    },
)


@pytest.fixture
def settings_from_files(monkeypatch: pytest.MonkeyPatch) -> None:
    """Settings built in a test see the deploy files' values, not this machine's TOOLQ_ env."""
    for name in [name for name in os.environ if name.startswith("TOOLQ_")]:
        monkeypatch.delenv(name)


#: Every TOOLQ_ setting is a field of one of these (or of both, where they share it).
SETTINGS_CLASSES = (WorkerSettings, OrchestratorSettings)
SETTING_NAMES = {name for cls in SETTINGS_CLASSES for name, _ in setting_names(cls)}


def settings_of(environment: dict[str, str]) -> WorkerSettings:
    """The worker settings there, after checking every TOOLQ_ value against the settings
    classes that read it."""
    values = {
        name.removeprefix("TOOLQ_").lower(): files.interpolated(value)
        for name, value in environment.items()
        if name.startswith("TOOLQ_")
    }
    assert set(values) <= SETTING_NAMES, set(values) - SETTING_NAMES
    OrchestratorSettings.model_validate(
        {k: v for k, v in values.items() if k in dict(setting_names(OrchestratorSettings))}
    )
    # A sandbox field is given by its variable's name (sandbox_isolation), as in the files.
    return WorkerSettings.model_validate(
        {k: v for k, v in values.items() if k in dict(setting_names(WorkerSettings))}
    )


def manifest_id(entry: tuple[str, files.Manifest]) -> str:
    source, document = entry
    return f"{source}:{document['kind']}/{document['metadata']['name']}"


CORE_MANIFESTS = [entry for entry in files.manifests() if entry[1]["kind"] not in files.KEDA_KINDS]


# -- the files are valid -----------------------------------------------------------------------


@pytest.mark.parametrize("entry", CORE_MANIFESTS, ids=manifest_id)
def test_manifest_matches_the_kubernetes_schema(entry: tuple[str, files.Manifest]) -> None:
    kubernetes_validate.validate(entry[1], K8S_VERSION, strict=True)


def test_schema_validation_rejects_a_misspelt_field() -> None:
    broken = copy.deepcopy(files.deployment(SANDBOX))
    broken["spec"]["template"]["spec"]["containers"][0]["securityContex"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, K8S_VERSION, strict=True)


@pytest.mark.parametrize(
    ("kind", "schema"),
    [
        ("ScaledObject", SCALED_OBJECT_SCHEMA),
        ("TriggerAuthentication", TRIGGER_AUTHENTICATION_SCHEMA),
    ],
)
def test_keda_objects_match_the_keda_fields_used(kind: str, schema: dict[str, Any]) -> None:
    found = files.objects(kind)
    assert found, f"keda.yaml defines no {kind}"
    for name, document in found.items():
        errors = list(jsonschema.Draft202012Validator(schema).iter_errors(document))
        assert not errors, f"{kind} {name}: {[error.message for error in errors]}"


def test_compose_file_matches_the_compose_specification() -> None:
    vendored = importlib.resources.files("check_jsonschema.builtin_schemas.vendor")
    schema = json.loads((vendored / "compose-spec.json").read_text())
    validator = jsonschema.validators.validator_for(schema)(schema)
    errors = [
        f"{error.json_path}: {error.message}" for error in validator.iter_errors(files.compose())
    ]
    assert not errors


def test_kustomization_applies_every_manifest_but_the_example_secret() -> None:
    listed = set(files.kustomization()["resources"])
    on_disk = {path.name for path in files.k8s_files()}
    assert listed == on_disk - {files.EXAMPLE_SECRET}


# -- the sandbox reaches the broker and nothing else -------------------------------------------


def test_compose_sandbox_is_only_on_internal_networks() -> None:
    sandbox = files.services()[SANDBOX]
    networks = files.compose()["networks"]
    attached = files.service_networks(sandbox)
    assert attached, "the sandbox must name its networks, or compose attaches the default one"
    for network in attached:
        assert (networks[network] or {}).get("internal") is True, f"{network} is not internal"
    for escape in ("ports", "network_mode", "extra_hosts", "links", "external_links"):
        assert escape not in sandbox
    broker_url = files.interpolated(files.service_environment(sandbox)["TOOLQ_BROKER_URL"])
    broker_host = urlsplit(broker_url).hostname
    assert broker_host in files.services()
    assert set(files.service_networks(files.services()[str(broker_host)])) & set(attached)


def sandbox_policies() -> list[files.Manifest]:
    labels = files.pod_labels(SANDBOX)
    return [
        policy
        for policy in files.objects("NetworkPolicy").values()
        if files.selects(policy["spec"]["podSelector"], labels)
    ]


def selected_deployments(selector: files.Manifest) -> list[str]:
    return [
        name
        for name in files.objects("Deployment")
        if files.selects(selector, files.pod_labels(name))
    ]


def is_broker_rule(rule: files.Manifest) -> bool:
    """Only to the Redis pods (an empty selector would mean every pod), only on Redis's port."""
    peers = rule.get("to", [])
    return (
        bool(peers)
        and all(set(peer) == {"podSelector"} for peer in peers)
        and all(selected_deployments(peer["podSelector"]) == ["redis"] for peer in peers)
        and rule.get("ports") == [{"protocol": "TCP", "port": 6379}]
    )


def is_dns_rule(rule: files.Manifest) -> bool:
    peers = rule.get("to", [])
    return (
        bool(peers)
        and all(
            peer.get("namespaceSelector", {}).get("matchLabels")
            == {"kubernetes.io/metadata.name": "kube-system"}
            and peer.get("podSelector", {}).get("matchLabels") == {"k8s-app": "kube-dns"}
            for peer in peers
        )
        and bool(rule.get("ports"))
        and all(port["port"] == 53 for port in rule["ports"])
    )


def test_k8s_sandbox_egress_goes_to_the_broker_and_dns_only() -> None:
    policies = sandbox_policies()
    assert policies, "no NetworkPolicy selects the sandbox pods"
    # Policies add up: every one that selects the sandbox must be as narrow.
    assert any({"Ingress", "Egress"} <= set(p["spec"].get("policyTypes", [])) for p in policies)
    egress = [rule for policy in policies for rule in policy["spec"].get("egress", [])]
    ingress = [rule for policy in policies for rule in policy["spec"].get("ingress", [])]
    assert ingress == []
    assert any(is_broker_rule(rule) for rule in egress)
    unexpected = [rule for rule in egress if not (is_broker_rule(rule) or is_dns_rule(rule))]
    assert unexpected == []


def k8s_broker_url() -> str:
    """The broker URL of every toolq Deployment, which must be one and the same."""
    urls = {
        files.container_environment(name)["TOOLQ_BROKER_URL"] for name in files.toolq_deployments()
    }
    assert len(urls) == 1, urls
    return urls.pop()


def test_k8s_broker_rule_matches_the_redis_service() -> None:
    service = files.objects("Service")["redis"]
    assert files.selects({"matchLabels": service["spec"]["selector"]}, files.pod_labels("redis"))
    assert [port["port"] for port in service["spec"]["ports"]] == [6379]
    broker = urlsplit(k8s_broker_url())
    assert broker.hostname is not None and broker.hostname.split(".")[0] == "redis"
    assert broker.port == 6379


def test_keda_may_read_the_queue_lengths() -> None:
    redis_labels = files.pod_labels("redis")
    for policy in files.objects("NetworkPolicy").values():
        if not files.selects(policy["spec"]["podSelector"], redis_labels):
            continue
        peers = [
            peer for rule in policy["spec"].get("ingress", []) for peer in rule.get("from", [])
        ]
        keda = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "keda"}}}
        assert keda in peers, f"{policy['metadata']['name']} shuts KEDA out: pools would not scale"


def test_sandbox_receives_no_secret_but_the_redis_password() -> None:
    sandbox = files.services()[SANDBOX]
    assert not set(files.service_environment(sandbox)) & set(SECRET_VARIABLES)
    assert "env_file" not in sandbox and "secrets" not in sandbox
    spec = files.pod_spec(SANDBOX)
    assert spec["automountServiceAccountToken"] is False
    for container in spec["containers"]:
        assert not [source for source in container.get("envFrom", []) if "secretRef" in source]
        references = [
            variable["valueFrom"]["secretKeyRef"]
            for variable in container.get("env", [])
            if "secretKeyRef" in variable.get("valueFrom", {})
        ]
        assert references == [{"name": REDIS_SECRET, "key": REDIS_PASSWORD}]
    # The fleet secret alone, as a file its commands' uids cannot read (they seal nothing).
    mounted = [v for v in spec.get("volumes", []) if {"secret", "projected"} & set(v)]
    assert mounted == [
        {"name": "fleet-secret", "secret": {"secretName": "toolq-fleet", "defaultMode": 0o440}}
    ]


# -- every container is locked down ------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(files.services()))
def test_compose_service_is_locked_down(name: str) -> None:
    service = files.services()[name]
    user = str(service.get("user", ""))
    assert user, f"{name} runs as the image's user, which may be root"
    if name in POOL_CAPABILITIES:
        # Root in the user namespace of the daemon's userns-remap, which `host` would leave.
        assert service.get("userns_mode") is None
        added = service.get("cap_add", [])
        assert len(added) == len(set(added)) and set(added) == POOL_CAPABILITIES[name]
    else:
        assert user.split(":")[0] not in ("0", "root")
        assert "cap_add" not in service
        assert not [o for o in service.get("security_opt", []) if "unconfined" in o]
    assert service.get("read_only") is True
    assert service.get("cap_drop") == ["ALL"]
    assert "no-new-privileges:true" in service.get("security_opt", [])
    assert not service.get("privileged", False)
    assert service.get("network_mode") != "host"


def test_compose_sandbox_has_limits() -> None:
    sandbox = files.services()[SANDBOX]
    assert sandbox.get("pids_limit", 0) > 0
    assert sandbox.get("mem_limit")
    assert float(sandbox.get("cpus", 0)) > 0
    assert any(entry.startswith("/tmp") for entry in sandbox.get("tmpfs", []))


@pytest.mark.parametrize("name", sorted(files.toolq_services()))
def test_compose_toolq_service_has_limits(name: str) -> None:
    service = files.toolq_services()[name]
    assert service.get("mem_limit") and float(service.get("cpus", 0)) > 0
    assert service.get("pids_limit", 0) > 0


def test_compose_workers_scale() -> None:
    for pool in SERVED:
        worker = files.services()[f"worker-{pool}"]
        assert "container_name" not in worker
        assert "ports" not in worker


@pytest.mark.parametrize("name", sorted(files.objects("Deployment")))
def test_k8s_deployment_is_locked_down(name: str) -> None:
    spec = files.pod_spec(name)
    pod_context = spec.get("securityContext", {})
    assert spec.get("automountServiceAccountToken") is False
    assert not [key for key in ("hostNetwork", "hostPID", "hostIPC") if spec.get(key)]
    for container in spec["containers"]:
        context = {**pod_context, **container.get("securityContext", {})}
        added = context.get("capabilities", {}).get("add", [])
        if name in POOL_CAPABILITIES:
            # Root, in the pod's own user namespace: an unprivileged range of uids on the node.
            assert spec.get("hostUsers") is False
            assert len(added) == len(set(added)) and set(added) == POOL_CAPABILITIES[name]
            # The API refuses `CAP_SYS_ADMIN` next to allowPrivilegeEscalation: false.
            assert not [capability for capability in added if capability.startswith("CAP_")]
        else:
            assert context.get("runAsNonRoot") is True, container["name"]
            assert context.get("runAsUser", 0) > 0
            assert added == []
        assert context.get("readOnlyRootFilesystem") is True
        assert context.get("allowPrivilegeEscalation") is False
        assert context.get("capabilities", {}).get("drop") == ["ALL"]
        assert context.get("seccompProfile", {}).get("type") == "RuntimeDefault"
        assert not context.get("privileged", False)
        resources = container.get("resources", {})
        for kind in ("requests", "limits"):
            assert {"cpu", "memory"} <= set(resources.get(kind, {})), f"{container['name']} {kind}"


#: What the baseline Pod Security Standard lets a container add.
BASELINE_CAPABILITIES = {
    "AUDIT_WRITE",
    "CHOWN",
    "DAC_OVERRIDE",
    "FOWNER",
    "FSETID",
    "KILL",
    "MKNOD",
    "NET_BIND_SERVICE",
    "SETFCAP",
    "SETGID",
    "SETPCAP",
    "SETUID",
    "SYS_CHROOT",
}


def beyond_baseline(name: str) -> set[str]:
    """What a Deployment's pods ask that the baseline Pod Security Standard refuses."""
    spec = files.pod_spec(name)
    found = {key for key in ("hostNetwork", "hostPID", "hostIPC") if spec.get(key)}
    found |= {"hostPath" for volume in spec.get("volumes", []) if "hostPath" in volume}
    for container in spec["containers"]:
        context = {**spec.get("securityContext", {}), **container.get("securityContext", {})}
        added = set(context.get("capabilities", {}).get("add", []))
        found |= {f"capability {capability}" for capability in added - BASELINE_CAPABILITIES}
        if context.get("privileged"):
            found.add("privileged")
        if context.get("procMount", "Default") != "Default":
            found.add(f"procMount {context['procMount']}")
        for profile in ("seccompProfile", "appArmorProfile"):
            if context.get(profile, {}).get("type") == "Unconfined":
                found.add(f"{profile} Unconfined")
    return found


def test_only_the_sandbox_pool_goes_beyond_the_baseline_pod_security_standard() -> None:
    beyond = {name: beyond_baseline(name) for name in files.objects("Deployment")}
    assert {name for name, found in beyond.items() if found} == {SANDBOX}
    assert beyond[SANDBOX] == {"capability SYS_ADMIN", "procMount Unmasked"}
    # So the namespace admits it, and names it (warns) on every apply.
    for namespace in files.objects("Namespace").values():
        labels = namespace["metadata"]["labels"]
        assert labels["pod-security.kubernetes.io/enforce"] == "privileged"
        assert labels["pod-security.kubernetes.io/warn"] == "baseline"
    namespaces = {doc["metadata"].get("namespace") for _, doc in files.manifests()} - {None}
    assert namespaces == set(files.objects("Namespace"))


def test_k8s_only_the_sandbox_unmasks_proc_and_only_in_its_user_namespace() -> None:
    for name in files.objects("Deployment"):
        for container in files.containers(name):
            unmasked = container.get("securityContext", {}).get("procMount") == "Unmasked"
            assert unmasked == (name == SANDBOX), name
    assert files.pod_spec(SANDBOX)["hostUsers"] is False


# -- health checks -----------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(files.services()))
def test_compose_service_has_a_healthcheck(name: str) -> None:
    check = files.services()[name].get("healthcheck", {})
    assert check.get("test") and not check.get("disable", False)


@pytest.mark.parametrize("name", sorted(files.toolq_services()))
def test_compose_healthcheck_probes_the_role_the_service_runs(name: str) -> None:
    healthcheck = files.healthcheck_module()
    service = files.toolq_services()[name]
    test = service["healthcheck"]["test"]
    assert test[:2] == ["CMD", "toolq-healthcheck"]
    role = healthcheck.role_of(service["command"])
    assert test[2] == role
    if role == "api":
        assert healthcheck.api_port(test[3:]) == healthcheck.api_port(service["command"])


@pytest.mark.parametrize("name", sorted(files.objects("Deployment")))
def test_k8s_containers_have_probes(name: str) -> None:
    for container in files.containers(name):
        assert "livenessProbe" in container or "readinessProbe" in container, container["name"]


def test_k8s_probes_check_each_role() -> None:
    healthcheck = files.healthcheck_module()
    for name in files.toolq_deployments():
        container = files.containers(name)[0]
        role = healthcheck.role_of(container["args"])
        if role == "api":
            probe = container["readinessProbe"]["httpGet"]
            ports = {port["name"]: port["containerPort"] for port in container["ports"]}
            assert probe["path"] == "/healthz"
            assert ports.get(probe["port"], probe["port"]) == healthcheck.api_port(
                container["args"]
            )
        else:
            assert container["livenessProbe"]["exec"]["command"] == ["toolq-healthcheck", role]


def test_worker_shutdown_grace_outlasts_the_longest_call(settings_from_files: None) -> None:
    for pool in POOLS:
        name = f"worker-{pool}"
        longest = settings_of(files.container_environment(name)).hard_limit_s
        assert files.pod_spec(name)["terminationGracePeriodSeconds"] > longest
        service = files.services()[name]
        longest = settings_of(files.service_environment(service)).hard_limit_s
        assert files.duration_s(service["stop_grace_period"]) > longest


# -- the agents workers ------------------------------------------------------------------------


def test_agents_workers_hold_the_model_key_and_no_workspace() -> None:
    service = files.services()[AGENTS]
    environment = files.service_environment(service)
    assert re.fullmatch(r"\$\{OPENAI_API_KEY:\?.+\}", environment["OPENAI_API_KEY"])
    assert "TOOLQ_API_TOKEN" not in environment
    assert service.get("volumes", []) == [FLEET_SECRET_MOUNT]  # the fleet secret, no workspace
    # The model is outside: a network that reaches off the host, and the broker's.
    networks = files.compose()["networks"]
    attached = files.service_networks(service)
    assert "broker" in attached
    assert any(not (networks[n] or {}).get("internal") for n in attached)
    env = {v["name"]: v for v in files.containers(AGENTS)[0]["env"]}
    reference = env["OPENAI_API_KEY"]["valueFrom"]["secretKeyRef"]
    assert reference == {"name": "toolq-secrets", "key": "OPENAI_API_KEY"}
    assert "TOOLQ_API_TOKEN" not in env
    assert "workspaces" not in {v["name"] for v in files.pod_spec(AGENTS)["volumes"]}


def conversation_limit(environment: dict[str, str]) -> float:
    values = {
        name.removeprefix("TOOLQ_").lower(): files.interpolated(value)
        for name, value in environment.items()
        if name.startswith("TOOLQ_")
    }
    known = {k: v for k, v in values.items() if k in OrchestratorSettings.model_fields}
    return OrchestratorSettings.model_validate(known).conversation_timeout_s


def test_agents_workers_and_their_callers_agree_on_the_conversation_limit(
    settings_from_files: None,
) -> None:
    """The callers (the API) wait as long as the agents workers let a conversation run."""
    compose = {name: files.service_environment(files.services()[name]) for name in ("api", AGENTS)}
    assert conversation_limit(compose["api"]) == conversation_limit(compose[AGENTS])
    k8s = {name: files.container_environment(name) for name in ("api", AGENTS)}
    assert conversation_limit(k8s["api"]) == conversation_limit(k8s[AGENTS])
    concurrency = int(k8s[AGENTS]["TOOLQ_AGENT_CONCURRENCY"])
    [trigger] = files.objects("ScaledObject")[AGENTS]["spec"]["triggers"]
    assert 0 < int(trigger["metadata"]["listLength"]) <= concurrency


# -- secrets are required and never baked in ---------------------------------------------------


def test_compose_requires_the_secrets() -> None:
    api = files.service_environment(files.services()["api"])
    for name in SECRET_VARIABLES:
        assert re.fullmatch(rf"\$\{{{name}:\?.+\}}", api[name]), f"{name} must use ${{{name}:?...}}"
    example = (files.DEPLOY / ".env.example").read_text()
    for name in SECRET_VARIABLES:
        assert re.search(rf"^{name}=$", example, flags=re.MULTILINE), f"{name} in .env.example"


def test_k8s_api_reads_the_secrets_from_the_secret() -> None:
    secret = files.objects("Secret")["toolq-secrets"]
    env = {v["name"]: v for v in files.containers("api")[0]["env"]}
    for name in SECRET_VARIABLES:
        reference = env[name]["valueFrom"]["secretKeyRef"]
        assert reference["name"] == "toolq-secrets" and not reference.get("optional", False)
        assert reference["key"] in secret["stringData"]


def test_example_secrets_hold_only_placeholders() -> None:
    secrets = files.objects("Secret")
    assert {"toolq-secrets", REDIS_SECRET} <= set(secrets)
    for name, secret in secrets.items():
        assert "data" not in secret, name
        for key, value in secret["stringData"].items():
            assert value.startswith("REPLACE-ME"), f"{name}: {key} holds a value that looks real"


def test_no_secret_is_set_in_plain_text() -> None:
    for name, service in files.services().items():
        for variable, value in files.service_environment(service).items():
            # A *_FILE variable names where a secret is, not the secret.
            if SECRET_NAME.search(variable) and not variable.endswith("_FILE"):
                assert value.startswith("${") and ":-" not in value, f"{name}: {variable}"
    for name in files.objects("ConfigMap"):
        assert not [
            key
            for key in files.objects("ConfigMap")[name]["data"]
            if SECRET_NAME.search(key) and not key.endswith("_FILE")
        ]
    for name in files.objects("Deployment"):
        for container in files.containers(name):
            plain = [v["name"] for v in container.get("env", []) if "value" in v]
            assert not [variable for variable in plain if SECRET_NAME.search(variable)]


def test_one_fleet_secret_is_made_once_and_every_toolq_container_reads_it() -> None:
    [maker] = files.one_shot_services().values()
    assert maker["volumes"] == [FLEET_SECRET_MOUNT.removesuffix(":ro")]
    assert maker["network_mode"] == "none" and maker["cap_add"] == ["CHOWN"]
    script = maker["entrypoint"][-1]
    assert "make_secret_file" in script and "0o400" in script
    for name, service in files.toolq_services().items():
        assert FLEET_SECRET_MOUNT in service.get("volumes", []), name
        assert files.service_environment(service)["TOOLQ_FLEET_SECRET_FILE"] == (
            "/var/lib/toolq/fleet/fleet-secret"
        )
        assert service["depends_on"]["fleet-secret"] == {
            "condition": "service_completed_successfully"
        }
    for name in files.toolq_deployments():
        mounts = {m["name"]: m for m in files.containers(name)[0]["volumeMounts"]}
        assert mounts["fleet-secret"]["readOnly"] is True, name


# -- Redis wants a password, and every client has it -------------------------------------------


def strings_in(node: object) -> Iterator[str]:
    """Every string value in a parsed YAML document."""
    if isinstance(node, str):
        yield node
    elif isinstance(node, dict):
        for value in node.values():
            yield from strings_in(value)
    elif isinstance(node, list):
        for value in node:
            yield from strings_in(value)


def test_every_redis_url_carries_the_password() -> None:
    compose_urls = [
        files.interpolated(value) for value in strings_in(files.compose()) if "redis://" in value
    ]
    k8s_urls = [
        value for _, doc in files.manifests() for value in strings_in(doc) if "redis://" in value
    ]
    assert compose_urls and k8s_urls
    for url in compose_urls:
        assert urlsplit(url).password == f"<{REDIS_PASSWORD}>", url
    for url in k8s_urls:
        assert urlsplit(url).password == f"$({REDIS_PASSWORD})", url
    for url in re.findall(r"rediss?://[^\s`'\"]+", files.DEPLOY_DOC.read_text()):
        parts = urlsplit(url)
        assert not parts.hostname or parts.password, f"docs/deploy.md: {url}"


def test_compose_redis_requires_the_password() -> None:
    redis = files.services()["redis"]
    command = redis["command"]
    assert files.required_variable(command[command.index("--requirepass") + 1]) == REDIS_PASSWORD
    # Calls queued but not yet taken survive a restart.
    assert command[command.index("--appendonly") + 1] == "yes"
    # The health check logs in (redis-cli reads REDISCLI_AUTH): PONG means the password works.
    environment = files.service_environment(redis)
    assert files.required_variable(environment["REDISCLI_AUTH"]) == REDIS_PASSWORD
    kind, check = redis["healthcheck"]["test"]
    assert kind == "CMD-SHELL" and "redis-cli ping" in check and "PONG" in check
    for name, service in files.toolq_services().items():
        url = files.interpolated(files.service_environment(service)["TOOLQ_BROKER_URL"])
        assert urlsplit(url).password == f"<{REDIS_PASSWORD}>", name
    example = files.ENV_EXAMPLE.read_text()
    assert re.search(rf"^{REDIS_PASSWORD}=$", example, flags=re.MULTILINE)


def secret_reference(variable: files.Manifest) -> dict[str, Any]:
    reference: dict[str, Any] = variable["valueFrom"]["secretKeyRef"]
    assert not reference.get("optional", False), variable["name"]
    return reference


def test_k8s_redis_requires_the_password_from_the_secret() -> None:
    [container] = files.containers("redis")
    args = container["args"]
    assert args[args.index("--requirepass") + 1] == f"$({REDIS_PASSWORD})"
    assert args[args.index("--appendonly") + 1] == "yes"
    env = files.container_env("redis")
    names = [variable["name"] for variable in env]
    assert secret_reference(env[names.index(REDIS_PASSWORD)]) == {
        "name": REDIS_SECRET,
        "key": REDIS_PASSWORD,
    }
    # The probe logs in: $(VAR) expands only a variable listed before it.
    assert env[names.index("REDISCLI_AUTH")]["value"] == f"$({REDIS_PASSWORD})"
    assert names.index(REDIS_PASSWORD) < names.index("REDISCLI_AUTH")
    probe = " ".join(container["readinessProbe"]["exec"]["command"])
    assert "redis-cli ping" in probe and "PONG" in probe
    assert REDIS_PASSWORD in files.objects("Secret")[REDIS_SECRET]["stringData"]


@pytest.mark.parametrize("name", files.toolq_deployments())
def test_k8s_component_logs_in_to_redis_with_the_secret_password(name: str) -> None:
    env = files.container_env(name)
    names = [variable["name"] for variable in env]
    assert secret_reference(env[names.index(REDIS_PASSWORD)]) == {
        "name": REDIS_SECRET,
        "key": REDIS_PASSWORD,
    }
    # After the password: $(REDIS_PASSWORD) before it would stay as it is written.
    assert names.index(REDIS_PASSWORD) < names.index("TOOLQ_BROKER_URL")
    url = env[names.index("TOOLQ_BROKER_URL")]["value"]
    assert urlsplit(url).password == f"$({REDIS_PASSWORD})"
    # A ConfigMap's values are never expanded: a broker URL there would carry no password.
    assert "TOOLQ_BROKER_URL" not in files.config_map_data()


# -- each run apart: the pools' user namespaces and the sandbox's isolation ---------------------


def test_sandbox_isolation_is_namespaces_and_refuses_to_share(settings_from_files: None) -> None:
    compose = settings_of(files.service_environment(files.services()[SANDBOX]))
    k8s = settings_of(files.container_environment(SANDBOX))
    for settings in (compose, k8s):
        assert settings.sandbox.isolation == "namespaces"
        assert settings.sandbox.shared == "deny"


def uid_range(text: str) -> range:
    first, _, last = text.partition("-")
    return range(int(first), int(last) + 1)


def test_pools_give_runs_uids_their_user_namespace_maps(settings_from_files: None) -> None:
    environments = {
        "compose": [files.service_environment(files.services()[f"worker-{p}"]) for p in POOLS],
        "k8s": [files.container_environment(f"worker-{p}") for p in POOLS],
    }
    for deploy, pools in environments.items():
        # A run's workspace belongs to its uid whichever pool touches it: the pools agree.
        ranges = {settings_of(environment).sandbox.uid_range for environment in pools}
        assert len(ranges) == 1, f"{deploy}: {ranges}"
        uids = uid_range(ranges.pop())
        assert MAPPED_UIDS.start <= uids.start and uids.stop <= MAPPED_UIDS.stop, deploy
        assert not [uid for uid in RESERVED_UIDS if uid in uids], deploy


def test_sandbox_mounts_under_the_shipped_apparmor_profile() -> None:
    profile = (files.APPARMOR / APPARMOR_PROFILE).read_text()
    assert re.search(rf"^profile {APPARMOR_PROFILE} ", profile, flags=re.MULTILINE)
    rules = [
        line.split("#", 1)[0].strip()
        for line in profile.splitlines()
        if line.split("#", 1)[0].strip()
    ]
    # The calls' own mounts, each to a named place; a bare `mount,` would allow any.
    mounts = [rule for rule in rules if rule.startswith("mount ")]
    assert mounts and all("->" in rule for rule in mounts)
    assert "mount," not in rules
    # What the runtime's default profile denies stays denied.
    for denied in (
        "@{PROC}/sysrq-trigger rwklx,",
        "@{PROC}/kcore rwklx,",
        "/sys/firmware/** rwklx,",
    ):
        assert f"deny {denied}" in rules
    context = files.containers(SANDBOX)[0]["securityContext"]
    assert context["appArmorProfile"] == {"type": "Localhost", "localhostProfile": APPARMOR_PROFILE}
    assert f"apparmor={APPARMOR_PROFILE}" in files.services()[SANDBOX]["security_opt"]


@pytest.mark.skipif(shutil.which("apparmor_parser") is None, reason="apparmor_parser not installed")
def test_apparmor_profile_compiles() -> None:
    result = subprocess.run(
        ["apparmor_parser", "--skip-kernel-load", "--skip-cache", "--stdout"],
        input=(files.APPARMOR / APPARMOR_PROFILE).read_bytes(),
        capture_output=True,
        check=False,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr.decode()


def isolation_section() -> str:
    text = files.DEPLOY_DOC.read_text()
    match = re.search(
        r"^### Isolation in the deploy\n(.*?)(?=^### )", text, flags=re.MULTILINE | re.DOTALL
    )
    assert match, "docs/deploy.md has no section 'Isolation in the deploy'"
    return match[1]


def test_docs_say_why_each_capability_and_what_each_mode_keeps() -> None:
    section = isolation_section()
    for capability in set().union(*POOL_CAPABILITIES.values()):
        assert f"`{capability}`" in section, capability
    for needed in (
        "hostUsers: false",
        "userns-remap",
        "runtimeClassName: gvisor",
        "TOOLQ_SANDBOX_SHARED=allow",
        "/proc/<pid>/environ",
    ):
        assert needed in section, needed
    # The gVisor option stays in the manifest, commented, where an operator looks for it.
    assert "# runtimeClassName: gvisor" in (files.K8S / "worker-sandbox.yaml").read_text()


# -- the Dockerfile ----------------------------------------------------------------------------


def test_dockerfile_is_multi_stage_on_slim_python() -> None:
    instructions = files.dockerfile_instructions()
    stages = [arguments for keyword, arguments in instructions if keyword == "FROM"]
    assert len(stages) >= 2
    defaults = files.dockerfile_assignments("ARG")
    runtime_image = re.sub(r"\$\{(\w+)\}", lambda m: defaults[m[1]], stages[-1].split()[0])
    assert runtime_image.startswith("python:3.11-slim")
    assert any(k == "COPY" and a.startswith("--from=") for k, a in instructions)


def test_dockerfile_runs_as_an_unprivileged_user() -> None:
    users = [
        arguments for keyword, arguments in files.dockerfile_instructions() if keyword == "USER"
    ]
    assert users, "no USER: the image would run as root"
    uid = users[-1].split(":")[0]
    assert uid.isdigit() and int(uid) > 0, "a numeric USER lets Kubernetes verify runAsNonRoot"
    # The pools run as root in a user namespace (test_*_is_locked_down); every other role as this.
    for name in set(files.toolq_services()) - set(POOL_CAPABILITIES):
        assert files.services()[name]["user"].split(":")[0] == uid
    for name in set(files.toolq_deployments()) - set(POOL_CAPABILITIES):
        assert files.pod_spec(name)["securityContext"]["runAsUser"] == int(uid)


def test_dockerfile_installs_what_the_sandbox_pool_runs_images_with() -> None:
    """A task's own image needs skopeo, umoci, an OCI runtime and catatonit on the worker: a pool
    started from this image without them would refuse every ``--image`` run."""
    installs = " ".join(
        arguments for keyword, arguments in files.dockerfile_instructions() if keyword == "RUN"
    )
    wanted = {"skopeo", "umoci", "catatonit", WorkerSettings.model_fields["oci_runtime"].default}
    wanted.add("runsc")  # gVisor, the runtime docs/deploy.md offers for stronger isolation
    found = set(re.findall(r"[\w.-]+", installs.split("apt-get install", 1)[-1]))
    assert wanted <= found, f"not installed: {sorted(wanted - found)}"


def test_dockerfile_bakes_in_no_secret() -> None:
    for keyword in ("ENV", "ARG"):
        named = [name for name in files.dockerfile_assignments(keyword) if SECRET_NAME.search(name)]
        assert named == [], f"{keyword} {named}: pass secrets at run time"


def test_dockerfile_entrypoint_environment_and_healthcheck() -> None:
    instructions = dict(files.dockerfile_instructions())
    assert json.loads(instructions["ENTRYPOINT"]) == ["toolq"]
    assert files.dockerfile_assignments("ENV").get("PYTHONDONTWRITEBYTECODE") == "1"
    assert "HEALTHCHECK" in instructions and instructions["HEALTHCHECK"] != "NONE"


# -- KEDA --------------------------------------------------------------------------------------


def test_keda_scales_each_pool_on_its_queue() -> None:
    scaled = {
        doc["spec"]["scaleTargetRef"]["name"]: doc for doc in files.objects("ScaledObject").values()
    }
    broker = urlsplit(k8s_broker_url())
    authentications = files.objects("TriggerAuthentication")
    for pool in SERVED:
        target = f"worker-{pool}"
        assert target in scaled, f"no ScaledObject scales {target}"
        container = files.containers(target)[0]
        assert container["args"] == ["worker", "--pool", pool]
        # Replicas in the Deployment would fight the autoscaler on every apply.
        assert "replicas" not in files.deployment(target)["spec"]
        [trigger] = scaled[target]["spec"]["triggers"]
        assert trigger["type"] == "redis"
        assert trigger["metadata"]["listName"] == pool
        assert trigger["metadata"]["address"] == f"{broker.hostname}:{broker.port}"
        assert trigger["metadata"]["databaseIndex"] == broker.path.strip("/")
        assert int(trigger["metadata"]["listLength"]) > 0
        # Redis wants a password: a trigger without it could not read the queue's length.
        assert "authenticationRef" in trigger, f"{target}'s trigger cannot log in to Redis"
        authentication = authentications[trigger["authenticationRef"]["name"]]
        assert {
            (ref["parameter"], ref["name"], ref["key"])
            for ref in authentication["spec"]["secretTargetRef"]
        } == {("password", REDIS_SECRET, REDIS_PASSWORD)}


# -- settings ----------------------------------------------------------------------------------


def deploy_texts() -> dict[str, str]:
    paths = [
        path
        for path in files.DEPLOY.rglob("*")
        if path.is_file() and "__pycache__" not in path.parts
    ]
    paths.append(files.DEPLOY_DOC)
    return {str(path.relative_to(files.REPO_ROOT)): path.read_text() for path in paths}


def test_every_toolq_variable_named_is_one_toolq_knows() -> None:
    fields = known_variables(SETTINGS_CLASSES)
    unknown = {
        (source, variable)
        for source, text in deploy_texts().items()
        for variable in TOOLQ_VARIABLE.findall(text)
        if variable not in fields
    }
    assert unknown == set()


def test_every_setting_value_in_the_deploy_files_is_accepted(settings_from_files: None) -> None:
    for name, service in files.toolq_services().items():
        assert settings_of(files.service_environment(service)), name
    for name in files.toolq_deployments():
        assert settings_of(files.container_environment(name)), name
    assert settings_of(files.dockerfile_assignments("ENV"))


def test_every_setting_is_documented() -> None:
    from docsgen.pages import generated

    # The settings reference is generated from the settings classes when the site is built.
    text = files.DEPLOY_DOC.read_text() + generated("settings")
    missing = [name for name in SETTING_NAMES if not re.search(rf"\bTOOLQ_{name.upper()}\b", text)]
    assert missing == []


def test_workspaces_are_shared_at_the_configured_root() -> None:
    for pool in POOLS:
        service = files.services()[f"worker-{pool}"]
        root = files.service_environment(service)["TOOLQ_WORKSPACE_ROOT"]
        assert f"workspaces:{root}" in service["volumes"]
        mounts = {
            m["name"]: m["mountPath"] for m in files.containers(f"worker-{pool}")[0]["volumeMounts"]
        }
        assert (
            mounts["workspaces"]
            == files.container_environment(f"worker-{pool}")["TOOLQ_WORKSPACE_ROOT"]
        )
        volumes = {v["name"]: v for v in files.pod_spec(f"worker-{pool}")["volumes"]}
        claim = volumes["workspaces"]["persistentVolumeClaim"]["claimName"]
        assert files.objects("PersistentVolumeClaim")[claim]["spec"]["accessModes"] == [
            "ReadWriteMany"
        ]


# -- commands ----------------------------------------------------------------------------------


def toolq_invocations() -> list[tuple[str, list[str]]]:
    found: list[tuple[str, list[str]]] = []
    instructions = dict(files.dockerfile_instructions())
    if json.loads(instructions["ENTRYPOINT"]) == ["toolq"]:
        found.append(("deploy/Dockerfile CMD", json.loads(instructions["CMD"])))
    for name, service in files.toolq_services().items():
        found.append((f"compose {name}", list(service["command"])))
    for name in files.toolq_deployments():
        for container in files.containers(name):
            assert "command" not in container, f"{name}: keep the image's toolq entrypoint"
            found.append((f"k8s {name}", list(container["args"])))
    for words in files.shell_lines(files.DEPLOY_DOC.read_text()):
        found += [("docs/deploy.md", args) for args in files.invocations(words, "toolq")]
    return found


def test_every_toolq_command_used_parses() -> None:
    try:
        from api.cli import app
    except ModuleNotFoundError as exc:
        if exc.name != "api.cli":
            raise
        pytest.skip("api/cli.py (the toolq command) is not there yet")
    group = typer.main.get_command(app)
    commands = getattr(group, "commands", None)
    assert isinstance(commands, dict), "the toolq app should be a group of subcommands"
    root = group.context_class(group, info_name="toolq")
    invocations = toolq_invocations()
    assert len(invocations) > 5
    for source, args in invocations:
        name, *rest = args
        assert name in commands, f"{source}: toolq {name} is not a toolq command"
        try:
            context = commands[name].make_context(name, rest, parent=root)
        except typer.TyperException as exc:
            pytest.fail(f"{source}: toolq {' '.join(args)}: {exc}")
        if name == "worker":
            assert context.params["pool"] in SERVED, f"{source}: no pool {context.params['pool']}"


def test_every_celery_command_in_the_docs_names_the_app_and_a_pool() -> None:
    commands = [
        args
        for words in files.shell_lines(files.DEPLOY_DOC.read_text())
        for args in files.invocations(words, "celery")
    ]
    commands += [
        args
        for words in re.findall(r"`(celery [^`]+)`", files.DEPLOY_DOC.read_text())
        for args in files.invocations(words.split(), "celery")
    ]
    with_app = [args for args in commands if "-A" in args]
    assert with_app
    for args in with_app:
        app_name = args[args.index("-A") + 1]
        assert isinstance(find_app(app_name), Celery)
        if "-Q" in args:
            queue = args[args.index("-Q") + 1]
            # Conversations have an app of their own; tool calls, the workers'.
            assert (app_name, queue) in {("worker.app", p) for p in POOLS} | {
                ("api.agents.app", AGENTS_QUEUE)
            }
