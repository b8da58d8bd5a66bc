"""The campaign Job's Role and ClusterRole grant exactly what servelab's code calls, no more.

The rules are derived from the code, never listed here: every reference to a method of a
kubernetes client API class (`self.core.list_namespaced_pod`, `self.apps.create_..._with_http_info`,
`self.custom.get_namespaced_custom_object`, a method handed to `stream`) in every module of
src/servelab the Job's pod can run. The receiver says which API class (`self.core =
client.CoreV1Api(...)`); the client's own request builder for the method says its HTTP verb and
path (`_<method>_serialize`: `method='GET'`, `resource_path='/api/v1/namespaces/{namespace}/pods'`);
path and verb give the rule as the API server authorizes it (GET on a named object: get, on a
collection: list; POST: create; PUT: update; PATCH: patch; DELETE: delete; a `connect_` method,
exec and the like: create). A custom object's group and plural come from the call's arguments,
followed to the module constant they unpack.

The derived rules must equal the rendered Role (namespaced resources) and ClusterRole (nodes),
both ways: a new API call fails here until the template grants it, a grant no code uses fails too.
The modules only the workstation runs (`servelab campaign submit|status --cluster|logs|fetch`)
are left out, and a test checks that nothing the Job runs imports them. A last test runs the
backend against the fake API server and checks every request it made is allowed by the rules.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import re
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import pytest
import yaml
from fakekube import FakeCluster, PodScript, backend_for, engine_log, running

from servelab.campaign.deploy import gate
from servelab.deploy.job_manifests import CampaignSpec, render_campaign
from servelab.deploy.manifests import render_for, write_rendered
from servelab.grid.config import deployment_for
from servelab.grid.settings import KubernetesSettings

REPO = Path(__file__).resolve().parents[2]
SRC = REPO / "src" / "servelab"
IMAGE = "registry.example/servelab@sha256:" + "0" * 64
# Modules the Job's pod never runs: their API calls are the submitting user's. Each with who may
# import it (checked below), so the Job cannot reach them.
WORKSTATION = {"servelab.deploy.kube_job": {"servelab.campaign.job"}}
WORKSTATION_IMPORTERS = {"servelab.campaign.job": {"servelab.campaign.cli"}}
HTTP_VERBS = {"POST": "create", "PUT": "update", "PATCH": "patch"}
# (apiGroup, resource, verb, namespaced)
Rule = tuple[str, str, str, bool]


# ----------------------------------------------------------------------------- the client


@cache
def api_class(name: str) -> type | None:
    """The kubernetes client's API class of that name (CoreV1Api, CustomObjectsApi, ...)."""
    from kubernetes import client

    value = getattr(client, name, None) if name.endswith("Api") and name != "ApiClient" else None
    return value if inspect.isclass(value) else None


@cache
def request_of(class_name: str, method: str) -> tuple[str, str]:
    """(HTTP verb, path template) of one API method, from the client's request builder."""
    base = method.removesuffix("_with_http_info").removesuffix("_without_preload_content")
    builder = getattr(api_class(class_name), f"_{base}_serialize")
    source = inspect.getsource(builder)
    http = re.search(r"method='([A-Z]+)'", source)
    path = re.search(r"resource_path='([^']+)'", source)
    assert http and path, f"{class_name}.{method}: the client's request builder changed shape"
    return http.group(1), path.group(1)


def rule_of(http: str, path: str, *, connect: bool = False) -> Rule:
    """The RBAC rule the API server checks for a request (a template or a concrete path)."""
    parts = path.strip("/").split("/")
    group, rest = ("", parts[2:]) if parts[0] == "api" else (parts[1], parts[3:])
    namespaced = rest[:1] == ["namespaces"] and len(rest) >= 3
    if namespaced:
        rest = rest[2:]
    resource = rest[0] + (f"/{rest[2]}" if len(rest) >= 3 else "")
    named = len(rest) >= 2
    if connect:
        verb = "create"  # exec, attach, port-forward: authorized as create on the subresource
    elif http == "GET":
        verb = "get" if named else "list"
    elif http == "DELETE":
        verb = "delete" if named else "deletecollection"
    else:
        verb = HTTP_VERBS[http]
    return group, resource, verb, namespaced


def test_the_rule_mapping_follows_the_api_servers_authorization() -> None:
    assert rule_of("GET", "/api/v1/namespaces/{namespace}/pods") == ("", "pods", "list", True)
    assert rule_of("GET", "/api/v1/namespaces/s/pods/p/log") == ("", "pods/log", "get", True)
    assert rule_of("PUT", "/apis/apps/v1/namespaces/s/deployments/d") == (
        "apps",
        "deployments",
        "update",
        True,
    )
    assert rule_of("PATCH", "/api/v1/nodes/{name}") == ("", "nodes", "patch", False)
    assert rule_of("GET", "/api/v1/nodes") == ("", "nodes", "list", False)
    assert rule_of("GET", "/api/v1/namespaces/s/pods/p/exec", connect=True)[2] == "create"
    assert request_of("CoreV1Api", "read_namespaced_pod_log") == (
        "GET",
        "/api/v1/namespaces/{namespace}/pods/{name}/log",
    )


# ----------------------------------------------------------------------------- the code


def modules(root: Path = SRC) -> dict[str, str]:
    """{dotted module name: source} of every module of the package."""
    found = {}
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path.read_text(encoding="utf-8")
    return found


def _receiver_key(node: ast.expr) -> str | None:
    """`self.core` -> `core`, `cluster.core` -> `core`, `core` -> `core`."""
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Name):
        return node.id
    return None


def _api_class_of(value: ast.expr) -> str | None:
    """`client.CoreV1Api(api_client)` or `CoreV1Api(...)` -> `CoreV1Api`."""
    if isinstance(value, ast.Call):
        func = value.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
        if isinstance(name, str) and api_class(name) is not None:
            return name
    return None


def receivers(trees: dict[str, ast.Module]) -> dict[str, str]:
    """Attribute or variable name -> the API class it holds, across the package (`core` ->
    CoreV1Api); one name may not hold two classes."""
    found: dict[str, str] = {}
    for tree in trees.values():
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign) and (cls := _api_class_of(node.value)):
                for target in node.targets:
                    key = _receiver_key(target)
                    assert key and found.get(key, cls) == cls, f"{key} holds two API classes"
                    found[key] = cls
    return found


def _parents(tree: ast.Module) -> dict[ast.AST, ast.AST]:
    return {child: parent for parent in ast.walk(tree) for child in ast.iter_child_nodes(parent)}


def _enclosing_function(node: ast.AST, parents: dict[ast.AST, ast.AST]) -> ast.AST | None:
    while node in parents:
        node = parents[node]
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            return node
    return None


def _value_of(arg: ast.expr, function: ast.AST | None, module: str) -> str:
    """A custom-object call's group or plural: a string literal, or a name unpacked in the
    calling function from a module constant (`group, version, plural = POD_MONITOR`)."""
    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
        return arg.value
    assert isinstance(arg, ast.Name), f"{module}: a custom object call's argument is not a name"
    for node in ast.walk(function) if function is not None else ():
        if (
            isinstance(node, ast.Assign)
            and isinstance(node.targets[0], ast.Tuple)
            and isinstance(node.value, ast.Name)
        ):
            names = [getattr(e, "id", None) for e in node.targets[0].elts]
            if arg.id in names:
                constant = getattr(importlib.import_module(module), node.value.id)
                return str(constant[names.index(arg.id)])
    raise AssertionError(f"{module}: cannot tell the value of {arg.id!r} in a custom object call")


def _custom_rule(
    rule: Rule, call: ast.AST | None, function: ast.AST | None, module: str, path: str
) -> Rule:
    """A custom object's rule: {group} and {plural} from the call's arguments."""
    assert isinstance(call, ast.Call), f"{module}: a custom object method not called directly"
    positions = {name: i for i, name in enumerate(re.findall(r"\{(\w+)\}", path))}
    assert len(call.args) > positions["plural"], f"{module}: pass group and plural by position"
    group = _value_of(call.args[positions["group"]], function, module)
    plural = _value_of(call.args[positions["plural"]], function, module)
    return group, rule[1].replace("{plural}", plural), rule[2], rule[3]


def calls_in(module: str, tree: ast.Module, held: dict[str, str]) -> Iterator[Rule]:
    """The rule of every API method `module` references."""
    parents: dict[ast.AST, ast.AST] = {}
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute):
            continue
        cls = held.get(_receiver_key(node.value) or "") or _api_class_of(node.value)
        if cls is None or not hasattr(api_class(cls), node.attr):
            continue
        http, path = request_of(cls, node.attr)
        rule = rule_of(http, path, connect=node.attr.startswith("connect_"))
        if "{group}" in path:
            parents = parents or _parents(tree)
            call = parents.get(node)
            function = _enclosing_function(node, parents)
            rule = _custom_rule(rule, call, function, module, path)
        yield rule


@cache
def parse(source: str) -> ast.Module:
    return ast.parse(source)


def derive(sources: dict[str, str]) -> set[Rule]:
    """The rules the code of `sources` ({module: source}) needs, workstation modules left out."""
    trees = {m: parse(s) for m, s in sources.items() if m not in WORKSTATION}
    held = receivers(trees)
    return {rule for module, tree in trees.items() for rule in calls_in(module, tree, held)}


# ----------------------------------------------------------------------------- the templates


def granted() -> set[Rule]:
    """The rules the rendered Role (namespaced) and ClusterRole (cluster-wide) grant."""
    spec = CampaignSpec(KubernetesSettings(), IMAGE, {"01-a.yaml": "backend: kubernetes\n"})
    rendered = render_campaign(spec)
    rules: set[Rule] = set()
    for name, namespaced in (("role.yaml", True), ("clusterrole.yaml", False)):
        for rule in yaml.safe_load(rendered[name])["rules"]:
            for group in rule["apiGroups"]:
                for resource in rule["resources"]:
                    rules |= {(group, resource, verb, namespaced) for verb in rule["verbs"]}
    return rules


def _show(rules: set[Rule]) -> list[str]:
    return [
        f"{g or 'core'}/{r} {v} ({'namespaced' if n else 'cluster'})"
        for g, r, v, n in sorted(rules)
    ]


def test_the_role_grants_exactly_what_the_code_calls() -> None:
    derived, rules = derive(modules()), granted()
    assert derived, "no API call found: the derivation is broken"
    assert ("", "nodes", "get", False) in derived  # node identity, cluster-scoped
    assert ("", "nodes", "patch", False) in derived  # node-slot labels (campaign.gpu_nodes)
    assert ("monitoring.coreos.com", "podmonitors", "create", True) in derived  # custom object
    assert not [r for r in rules if "secrets" in r[1]]
    assert derived == rules, (
        f"called but not granted (add to templates/campaign/role.yaml.j2 or clusterrole.yaml.j2): "
        f"{_show(derived - rules)}; granted but never called (remove): {_show(rules - derived)}"
    )


def test_a_planted_api_call_fails_the_comparison() -> None:
    sources = modules()
    planted = dict(sources)
    planted["servelab.deploy.kube_cluster"] += (
        "\n\ndef _planted(cluster):\n    cluster.core.delete_node('n')\n"
        "    cluster.apps.delete_collection_namespaced_deployment('ns')\n"
    )
    extra = derive(planted) - derive(sources)
    assert extra == {
        ("", "nodes", "delete", False),
        ("apps", "deployments", "deletecollection", True),
    }
    assert derive(planted) != granted()


def test_a_planted_custom_object_call_names_its_resource() -> None:
    source = (
        "from kubernetes import client\n"
        "class C:\n"
        "    def __init__(self, api):\n        self.custom = client.CustomObjectsApi(api)\n"
        "    def f(self):\n"
        "        self.custom.list_namespaced_custom_object('example.com', 'v1', 'ns', 'widgets')\n"
    )
    assert derive({"servelab.planted": source}) == {("example.com", "widgets", "list", True)}
    unreadable = source.replace("'example.com'", "pick()")
    with pytest.raises(AssertionError, match="not a name"):
        derive({"servelab.planted": unreadable})


def test_a_workstation_call_needs_no_grant() -> None:
    """kube_job's calls (create pods, exec, jobs, roles) are the submitter's, not the Job's."""
    sources = modules()
    trees = {m: parse(s) for m, s in sources.items()}
    workstation = {rule for m in WORKSTATION for rule in calls_in(m, trees[m], receivers(trees))}
    assert {("", "pods/exec", "create", True), ("batch", "jobs", "create", True)} <= workstation
    assert not workstation & {("", "pods/exec", "create", True)} & derive(sources)


def _imports(tree: ast.Module, module: str) -> set[str]:
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the module's package
                package = module.rsplit(".", node.level)[0]
                base = f"{package}.{base}".rstrip(".")
            found |= {base, *(f"{base}.{alias.name}" for alias in node.names)}
    return found


def test_nothing_the_job_runs_imports_the_workstation_modules() -> None:
    sources = modules()
    allowed = {**WORKSTATION, **WORKSTATION_IMPORTERS}
    for module, source in sources.items():
        imported = _imports(ast.parse(source), module)
        for target, importers in allowed.items():
            if target in imported:
                assert module in importers, f"{module} imports {target}: the Job could run it"
    for path in [
        REPO / "Snakefile",
        *(REPO / "workflow").rglob("*.smk"),
        *(REPO / "workflow").rglob("*.py"),
    ]:
        text = path.read_text(encoding="utf-8")
        for target in allowed:
            package, _, name = target.rpartition(".")
            pattern = (
                rf"{re.escape(target)}\b|from\s+{re.escape(package)}\s+import\s+[^\n]*\b{name}\b"
            )
            assert not re.search(pattern, text), f"{path} imports {target}"


# ----------------------------------------------------------------------------- the traffic


def test_every_request_the_backend_makes_is_granted(tmp_path: Path) -> None:
    """Deploy, confirm a run's engine, restart and tear down on the fake API server: every
    request it received is one the rules allow."""
    study = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    d = deployment_for(study, "defaults", "vllm", "rate-0.12")
    rendered = tmp_path / "manifests" / d.id
    write_rendered(render_for(study, d), rendered)
    spec = {
        "deployment_id": d.id,
        "engine": "vllm",
        "flags": list(d.flags),
        "image": study["engines"]["vllm"]["image"],
        "port": study["engines"]["vllm"]["port"],
        "expect_chunked_prefill": d.expect_chunked_prefill,
        "expect_chunk_size": d.expect_chunk_size,
    }
    cluster = FakeCluster(
        {"vllm": PodScript(engine_log("vllm-0.6.3-defaults"), terminate_s=5)},
        secrets={("servelab", "hf-token"): {"token": "hf_" + "x" * 30}},
        tick_s=5.0,
    )
    with running(cluster) as kube:
        backend = backend_for(kube)
        log_path = tmp_path / "results" / "deployments" / d.id / "startup.log"
        deployed = backend.deploy(spec, manifest_path=rendered, startup_log_path=log_path)
        assert deployed.on_gate is not None
        deployed.on_gate(None)
        backend.ensure_deployed(spec, gate=gate)
        backend.node_identity(d.id, container="vllm")
        backend.restart_timeline(d.id, rendered, tmp_path / "rep1" / "restart.json")
        backend.teardown(d.id)
    requests = {(method, path) for method, path in cluster.requests}
    assert len(requests) > 10
    rules = granted()
    denied = sorted(
        (method, path) for method, path in requests if rule_of(method, path) not in rules
    )
    assert not denied, f"requests the Role would refuse: {denied}"


def test_the_documented_role_is_the_rendered_one() -> None:
    """docs/kubernetes.md shows the Role's rules: the template's, not a copy that drifted."""
    text = (REPO / "docs" / "kubernetes.md").read_text(encoding="utf-8")
    block = re.search(r"The Role grants exactly.*?```yaml\n(.*?)```", text, re.S)
    assert block, "docs/kubernetes.md no longer shows the Role"
    documented = {
        (group, resource, verb, True)
        for rule in yaml.safe_load(block.group(1))["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }
    assert documented == {rule for rule in granted() if rule[3]}
