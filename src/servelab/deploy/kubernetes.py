"""The kubernetes backend: bring an engine up on a GPU node (study §3.3, §5.4, Appendix A.7 step 2).

This module is the `servelab.deploy.Backend` implementation and nothing else: what a deployment
and a run go through, built on the cluster operations of servelab.deploy.kube_cluster (API verbs,
pod lifecycle, waits, logs) and the node identity of servelab.deploy.node.

1. `deploy`: apply each rendered object, or replace it when it exists (the model-weight volume is
   created once and kept). Engine Deployments of *other* servelab deployments in the namespace are
   torn down first: one engine on the GPU at a time. With several node slots (`node`, config
   `campaign.gpu_nodes`) that is one engine per node: the backend measures on its slot's node,
   labelled for it (servelab.deploy.node.pin_node), pins the objects to it as it applies them
   (servelab.deploy.node.place: the rendered manifest does not depend on the slot), and retires
   only the engines of its own slot (and any pinned to none). A pod the deployment already had
   is deleted, so every deploy starts a fresh engine whose start-up log is complete. Once the engine pod is
   Ready (a bounded wait, failing fast on states that never recover), its start-up log is captured
   (any Hugging Face token value is redacted), written to startup.log and returned (`Deployed`)
   with the namespace, pod and node identity.
2. The campaign gates that log (servelab.campaign.deploy.gate; this module never gates of its own
   accord) and reports the verdict (`Deployed.on_gate`). On a pass the uid of the pod is recorded
   on the Deployment (servelab.dev/gated-pod-uid), so a run re-reads the start-up log only of a pod
   that has not passed yet. On a refusal nothing is deleted: the log is kept as startup.refused.log
   (which Snakemake does not remove with the failed job's outputs) and the Deployment is left
   running for inspection (the next deployment retires it).
3. `run` confirms the engine first (`ensure_deployed`): a Deployment retired by another deployment
   is applied again, and a pod not gated yet (one recreated after a reclamation) has its start-up
   log gated through the gate the campaign passed in (`RunRequest.gate`). A pod that has been
   sent the run's trace before (a retry, or a redo on a pod that stayed up: the Deployment's
   servelab.dev/served-traces records which traces its current pod was sent) is deleted first,
   so the run starts from a prefix cache that holds none of its prompts, as on the local backend
   (docs/campaigns.md, "A cold prompt cache"); the Deployment recreates it and it is gated. Node
   identity is recorded at run start and end and watched during the run; a change names the
   reclamation.
4. `teardown` deletes the Deployment, Service and PodMonitor (never the weight volume, nor the
   DCGM exporter's PodMonitor, which every deployment shares).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from servelab.artifacts import file_sha256, write_text
from servelab.deploy.backend import Deployed, Gate, NodeSlot, RunRequest
from servelab.deploy.kube_cluster import (
    KubeCluster,
    KubernetesBackendError,
    make_api_client,
)
from servelab.deploy.manifests import load_rendered, render_deployment
from servelab.deploy.measure import LiveTarget, measure_live
from servelab.deploy.node import node_change, observe, on_other_slot, pin_node, place, reclamation
from servelab.deploy.prompt_cache import fresh_server_reason
from servelab.deploy.restart import restart_timeline
from servelab.dispatch import DispatchResult
from servelab.grid.settings import KubernetesSettings

__all__ = ["KubernetesBackend"]

log = logging.getLogger(__name__)

STARTUP_LOG_LIMIT_BYTES = 32 * 1024 * 1024
# Written beside startup.log when the gate refuses a deployment (not a workflow output, so it
# survives the failed job).
REFUSED_LOG = "startup.refused.log"


class KubernetesBackend:
    """Deploy, run against and tear down engines on a cluster (`cluster`: its operations).

    `api_client` is a `kubernetes.client.ApiClient`; `settings` is the config's `kubernetes:`
    section, typed or as a mapping (partial is fine: the KubernetesSettings defaults fill the
    rest); `node` the node slot this backend measures on (default: the one node of a one-node
    campaign, nothing labelled or pinned). Build one with `from_settings`.
    """

    name = "kubernetes"

    def __init__(
        self,
        api_client: Any,
        settings: Mapping[str, Any] | KubernetesSettings | None = None,
        *,
        node: NodeSlot | None = None,
        sleep: Callable[[float], None] = time.sleep,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.cluster = KubeCluster(api_client, settings, sleep=sleep, monotonic=monotonic)
        self.settings = self.cluster.settings
        self.namespace = self.cluster.namespace
        self.node = node or NodeSlot()

    # ------------------------------------------------------------------ construction

    @classmethod
    def from_settings(
        cls, settings: Mapping[str, Any] | KubernetesSettings | None = None, **kwargs: Any
    ) -> KubernetesBackend:
        """Connect as the settings say: `kubeconfig`/`context` when given; else in-cluster when
        running in a pod; else $KUBECONFIG or ~/.kube/config. `kwargs`: `node` (the node slot),
        `sleep`, `monotonic`."""
        s = KubernetesSettings.from_section(settings)
        return cls(make_api_client(s.kubeconfig, s.context), s, **kwargs)

    @classmethod
    def from_config(cls, config: Mapping[str, Any], **kwargs: Any) -> KubernetesBackend:
        """From a whole servelab config (its `kubernetes:` section)."""
        return cls.from_settings(config.get("kubernetes"), **kwargs)

    def engine_url(self, deployment_id: str, port: int) -> str:
        """Where the dispatcher reaches the engine (kubernetes.engine_url, a format string with
        {service}, {namespace} and {port}: in-cluster DNS by default, or a port-forward)."""
        return self.settings.engine_url_for(deployment_id, port)

    # ------------------------------------------------------------------ the node slot

    def _retire_others(self, deployment_id: str) -> list[str]:
        """Tear down the other engines on this slot's node (with one slot: every other engine),
        logging each."""
        slot = self.node
        spare = None if slot.count == 1 else (lambda d: on_other_slot(d, slot))
        retired = self.cluster.retire_others(deployment_id, spare=spare)
        for line in retired:
            log.warning("one engine at a time: retired %s before deploying %s", line, deployment_id)
        return retired

    def pin(self) -> str | None:
        """The node this backend's slot measures on, labelled for it (servelab.deploy.node
        .pin_node; waits for a replacement after a reclamation). None with one slot: the engine
        goes wherever kubernetes.node_selector lets the scheduler put it."""
        return None if self.node.count == 1 else pin_node(self.cluster, self.node)

    def place(self, objects: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
        """The rendered objects pinned to this slot's node as they are applied
        (servelab.deploy.node.place; unchanged with one slot)."""
        return place(objects, self.node, self.settings.model_volume.claim_name)

    # ------------------------------------------------------------------ deploy

    def deploy(
        self,
        deployment: Mapping[str, Any],
        *,
        manifest_path: str | os.PathLike[str],
        startup_log_path: str | os.PathLike[str],
        timeout_s: float | None = None,
    ) -> Deployed:
        """Bring the deployment up as a fresh engine and write its start-up log; return the log
        with the namespace, pod and node identity. The campaign gates the log and reports the
        verdict through `Deployed.on_gate` (see the module docstring).

        `deployment` holds at least `deployment_id` and `engine`.
        """
        cluster = self.cluster
        deployment_id = str(deployment["deployment_id"])
        engine = str(deployment["engine"])
        objects = load_rendered(manifest_path)
        names = {o["metadata"]["name"] for o in objects if o["kind"] == "Deployment"}
        if names != {deployment_id}:
            raise KubernetesBackendError(
                f"{manifest_path}: expected the Deployment {deployment_id}, found {sorted(names)}"
            )
        self._retire_others(deployment_id)
        pinned = self.pin()
        running_before = [p["metadata"]["name"] for p in cluster.engine_pods(deployment_id)]
        for line in (cluster.apply_object(o)[0] for o in self.place(objects)):
            log.info("%s", line)
        # A deploy always starts a fresh engine: a clean cache, and a start-up log that is whole
        # (kubelet rotates the logs of a long-running pod, and the gate needs their first lines).
        for name in running_before:
            log.info("restarting the engine: deleting pod %s", name)
            cluster.delete_pod(name)
        pod = cluster.wait_ready(deployment_id, container=engine, timeout_s=timeout_s)
        pod_name, pod_uid = pod["metadata"]["name"], pod["metadata"].get("uid")
        text = self._startup_log(pod, engine)
        write_text(startup_log_path, text)
        facts: dict[str, Any] = {
            "namespace": self.namespace,
            "pod": {"name": pod_name, "uid": pod_uid},
            "node": observe(cluster, deployment_id, pod=pod),
        }
        if pinned is not None:
            facts["node_slot"] = {
                "index": self.node.index,
                "count": self.node.count,
                "node": pinned,
            }
        evidence = Path(startup_log_path).with_name(REFUSED_LOG)

        def on_gate(refusal: BaseException | None) -> None:
            if refusal is None:
                evidence.unlink(missing_ok=True)  # passed now
                cluster.mark_gated(deployment_id, str(pod_uid))
                return
            # Snakemake deletes a failed job's outputs: keep the evidence beside them.
            write_text(evidence, text)
            self._refused(
                deployment_id, pod_name, refusal, f"; its start-up log is kept as {evidence}"
            )

        return Deployed.read(startup_log_path, facts, on_gate)

    def _startup_log(self, pod: Mapping[str, Any], engine: str) -> str:
        """The Ready pod's start-up log (its container's log from the start, redacted)."""
        return self.cluster.pod_log(
            pod["metadata"]["name"], engine, limit_bytes=STARTUP_LOG_LIMIT_BYTES
        )

    @staticmethod
    def _refused(deployment_id: str, pod_name: str, refusal: BaseException, kept: str) -> None:
        log.error(
            "deployment %s (pod %s) refused by the resolved-configuration gate; it is left "
            "running for inspection (the next deployment, or teardown, removes it)%s: %s",
            deployment_id,
            pod_name,
            kept,
            refusal,
        )

    def ensure_deployed(
        self,
        deployment: Mapping[str, Any],
        *,
        gate: Gate | None,
        timeout_s: float | None = None,
    ) -> dict[str, Any]:
        """Make sure the deployment is up and its current pod passed `gate`; returns the pod.

        For runs: after a Spot reclamation the Deployment recreates the pod on the new node, and
        the new pod's start-up log is handed to `gate` (the campaign's) before the pod is recorded
        as gated (a pod already gated, per the Deployment's servelab.dev/gated-pod-uid
        annotation, is not read again). A refusal raises, the pod left running for inspection.
        When the Deployment is missing (retired by another deployment), it is rendered from
        `deployment` (deployment_id, engine, image, port, flags) and applied again. With several
        node slots the slot's node is labelled first (a replacement node after a reclamation
        carries no label: the pod recreated on the slot waits for it).
        """
        cluster = self.cluster
        deployment_id, engine = str(deployment["deployment_id"]), str(deployment["engine"])
        self.pin()
        if cluster.read_deployment(deployment_id) is None:
            log.warning("deployment %s is not in the cluster: deploying it again", deployment_id)
            rendered = render_deployment(
                deployment_id=deployment_id,
                engine=engine,
                image=str(deployment["image"]),
                port=int(deployment["port"]),
                flags=list(deployment["flags"]),
                namespace=self.namespace,
                k8s_settings=self.settings.as_dict(),
            )
            self._retire_others(deployment_id)
            for obj in self.place([yaml.safe_load(text) for text in rendered.values()]):
                cluster.apply_object(obj)
        pod = cluster.wait_ready(deployment_id, container=engine, timeout_s=timeout_s)
        pod_name, pod_uid = pod["metadata"]["name"], str(pod["metadata"]["uid"])
        if cluster.gated_pod(deployment_id) != pod_uid:
            if gate is None:
                raise KubernetesBackendError(
                    f"deployment {deployment_id}: pod {pod_name} has not passed the "
                    "resolved-configuration gate, and no gate was given to confirm it"
                )
            log.info(
                "deployment %s: pod %s not gated yet: reading its start-up log",
                deployment_id,
                pod_name,
            )
            try:
                gate(deployment, self._startup_log(pod, engine))
            except Exception as exc:
                self._refused(deployment_id, pod_name, exc, "")
                raise
            cluster.mark_gated(deployment_id, pod_uid)
        return pod

    # ------------------------------------------------------------------ node identity, teardown

    def node_identity(
        self,
        deployment_id: str | None = None,
        *,
        pod: Mapping[str, Any] | None = None,
        container: str | None = None,
    ) -> dict[str, Any]:
        """Identity of the engine pod and its node now (servelab.deploy.node.observe)."""
        return observe(self.cluster, deployment_id, pod=pod, container=container)

    def teardown(self, deployment_id: str, *, wait: bool = True) -> list[str]:
        """Delete the deployment's PodMonitor, Service and Deployment (not the weight volume);
        with `wait`, until its pods are gone. Returns what was deleted."""
        return self.cluster.teardown(deployment_id, wait=wait)

    # ------------------------------------------------------------------ restart experiment

    def restart_timeline(
        self,
        deployment_id: str,
        manifest_path: str | os.PathLike[str],
        out_json: str | os.PathLike[str],
        *,
        rep: str | None = None,
    ) -> dict[str, Any]:
        """Delete the engine pod, wait for it to terminate, re-apply, record the event timeline.

        See servelab.deploy.restart for the record format (docs/kubernetes.md).
        """
        return restart_timeline(
            self.cluster, deployment_id, manifest_path, out_json, rep=rep, place=self.place
        )

    # ------------------------------------------------------------------ runs

    def metrics_selector(self, deployment_id: str) -> dict[str, str]:
        """Prometheus label matchers of the deployment's series (kubernetes.metrics_selector)."""
        return self.settings.metrics_selector_for(deployment_id)

    def gpu_metrics_selector(self, deployment_id: str, pod: Mapping[str, Any]) -> dict[str, str]:
        """Prometheus label matchers of the engine GPU's DCGM series (kubernetes.
        gpu_metrics_selector, for the engine pod and its node); empty when none are configured or
        the pod names no node (the run's energy figures are then null)."""
        if not self.settings.gpu_metrics_selector:
            return {}
        node = str((pod.get("spec") or {}).get("nodeName") or "")
        if not node:
            log.warning("deployment %s: the engine pod names no node: no GPU series", deployment_id)
            return {}
        return self.settings.gpu_metrics_selector_for(
            deployment_id, node=node, pod=str(pod["metadata"]["name"])
        )

    def _cold_for(
        self,
        trace_path: str | os.PathLike[str],
        deployment: Mapping[str, Any],
        pod: Mapping[str, Any],
        *,
        gate: Gate | None,
    ) -> dict[str, Any]:
        """The engine pod to send `trace_path` to: `pod`, or, when it has been sent that trace
        before, or has been sent any and its engine's requests cost more the more it has served
        (`fresh_server_reason`), a fresh one (the old pod deleted; the new one ready and gated).
        The trace is recorded as sent before the first request: an attempt that breaks off has
        still filled the cache."""
        deployment_id = str(deployment["deployment_id"])
        trace_sha256 = file_sha256(trace_path)
        uid = str(pod["metadata"]["uid"])
        reason = fresh_server_reason(
            str(deployment["engine"]), self.cluster.served_traces(deployment_id, uid), trace_sha256
        )
        if reason is not None:
            log.info(
                "deployment %s: pod %s is restarted before trace %s...: %s",
                deployment_id,
                pod["metadata"]["name"],
                trace_sha256[:12],
                reason,
            )
            self.cluster.delete_pod(str(pod["metadata"]["name"]))
            pod = self.ensure_deployed(deployment, gate=gate)
            uid = str(pod["metadata"]["uid"])
        self.cluster.mark_served(deployment_id, uid, trace_sha256)
        return dict(pod)

    def run(self, request: RunRequest) -> dict[str, Any]:
        """One measured run against the deployed engine (the servelab.deploy.Backend protocol).

        The engine is confirmed first (`ensure_deployed`: redeployed if it was retired, and a pod
        recreated after a reclamation gated through the campaign's gate, `request.gate`). The
        dispatcher (servelab.dispatch.run.dispatch_run) reads node identity before the first
        request and after the last; when they differ the run is `interrupted` with a
        `reclaimed_reason`, which makes the campaign discard and repeat the condition. Then the
        run's Prometheus window (telemetry.prometheus_url) is pulled into scrape.parquet, with the
        engine GPU's DCGM energy and power series (`gpu_metrics_selector`), and run.json is
        written last. During the run node identity is read every
        `kubernetes.node_watch_s` seconds (default 15) and a change stops the run at once, so a
        reclaimed node does not keep it going (in-flight requests recorded as interrupted).
        """
        deployment = dict(request.deployment)
        deployment_id, engine = str(deployment["deployment_id"]), str(deployment["engine"])
        if request.faults:
            log.warning(
                "run %s: fault injection is for the sim and local backends; ignored on kubernetes: %s",
                request.run_id,
                request.faults,
            )
        pod = self.ensure_deployed(deployment, gate=request.gate)
        pod = self._cold_for(request.trace_path, deployment, pod, gate=request.gate)
        base_url = self.engine_url(deployment_id, int(deployment["port"]))
        prometheus_url = request.telemetry.prometheus_url
        gpu_selector = self.gpu_metrics_selector(deployment_id, pod)

        def reclaimed(record: Mapping[str, Any], result: DispatchResult) -> str | None:
            return reclamation(record.get("node") or {})

        return measure_live(
            request,
            LiveTarget(
                backend=self.name,
                base_url=base_url,
                node_identity=lambda: self.node_identity(deployment_id, container=engine),
                prometheus_url=prometheus_url,
                metrics_selector=self.metrics_selector(deployment_id),
                scrape_interval_s=self.settings.pod_monitor.interval_s,
                # a scrape interval after the window's closing time, so its scrape is stored
                scrape_settle_s=self.settings.pod_monitor.interval_s + 1.0,
                reclamation=reclaimed,
                extra={
                    "kubernetes": {
                        "namespace": self.namespace,
                        "pod": pod["metadata"]["name"],
                        "engine_url": base_url,
                        "prometheus_url": prometheus_url,
                        "gpu_metrics_selector": gpu_selector,
                    }
                },
                node_watch_s=self.settings.node_watch_s,
                node_change=node_change,
                gpu_selector=gpu_selector,
            ),
        )
