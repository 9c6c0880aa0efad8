"""The Kubeflow SDK (``kubeflow`` 0.5.0, ``TrainerClient``) lists and uses the runtime that
``nvtrain manifest --trainer-runtime`` renders, through its own Kubernetes backend.

The SDK talks to a stand-in API server on a local socket (no cluster): it serves the rendered
runtime as the API server would return it, and records the TrainJob that ``train()`` posts.
What the SDK checks is its own code: ``list_runtimes()`` skips a runtime without the label
``trainer.kubeflow.org/framework``, ``get_runtime()`` raises on it, and ``train()`` names the
TrainJob with 12 random characters (one lowercase letter, 11 hex digits), which do not hold
``[job] name``. Skipped where the SDK is not installed (``pip install kubeflow==0.5.0``, the
``dev`` extra).
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from templates_helpers import MINIMAL, by_kind, policy_of

from nvtrain.kube.manifest import render
from nvtrain.kube.options import ManifestOptions

kubeflow_types = pytest.importorskip(
    "kubeflow.trainer.types.types", reason="the Kubeflow SDK is not installed: pip install kubeflow==0.5.0"
)
from kubeflow.common.types import KubernetesBackendConfig  # noqa: E402
from kubeflow.trainer.api.trainer_client import TrainerClient  # noqa: E402
from kubernetes import client as kube_client  # noqa: E402

POLICY = MINIMAL + 'nproc_per_node = 8\n[rendezvous]\nnodes = 4\nnamespace = "team-a"\n'
GROUP = "/apis/trainer.kubeflow.org/v1alpha1"
SDK_NAME = re.compile(r"[a-z][0-9a-f]{11}")
"""``TrainerBackend.train``'s name: a lowercase letter and ``uuid4().hex[:11]``."""


class ApiServer:
    """Answers the SDK's reads of (Cluster)TrainingRuntimes from ``runtimes`` and records the
    TrainJobs it creates."""

    def __init__(self, runtimes: list[dict[str, Any]]) -> None:
        self.runtimes = runtimes
        self.created: list[dict[str, Any]] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _send(self, code: int, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                code, body = server.get(self.path.split("?", 1)[0])
                self._send(code, body)

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                body = json.loads(self.rfile.read(length))
                server.created.append(body)
                self._send(201, body)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def get(self, path: str) -> tuple[int, dict[str, Any]]:
        kinds = {"clustertrainingruntimes": "ClusterTrainingRuntime", "trainingruntimes": "TrainingRuntime"}
        for plural, kind in kinds.items():
            items = [r for r in self.runtimes if r["kind"] == kind]
            if path.endswith(f"/{plural}"):
                return 200, {
                    "apiVersion": "trainer.kubeflow.org/v1alpha1",
                    "kind": f"{kind}List",
                    "items": items,
                }
            if f"/{plural}/" in path and path.startswith(GROUP):
                name = path.rsplit("/", 1)[1]
                found = [r for r in items if r["metadata"]["name"] == name]
                if found:
                    return 200, found[0]
        return 404, {
            "kind": "Status",
            "apiVersion": "v1",
            "status": "Failure",
            "code": 404,
            "reason": "NotFound",
        }


@pytest.fixture
def api() -> Iterator[ApiServer]:
    runtime = by_kind(
        render(policy_of(POLICY), POLICY, ManifestOptions(trainer_runtime="cluster")),
        "ClusterTrainingRuntime",
    )
    server = ApiServer([json.loads(json.dumps(runtime))])
    thread = threading.Thread(target=server.httpd.serve_forever, daemon=True)
    thread.start()
    yield server
    server.httpd.shutdown()
    server.httpd.server_close()
    thread.join()


def sdk(api: ApiServer) -> TrainerClient:
    config = kube_client.Configuration(host=api.url)
    return TrainerClient(
        backend_config=KubernetesBackendConfig(namespace="team-a", client_configuration=config)
    )


def test_the_sdk_lists_gets_and_trains_on_the_runtime(api: ApiServer) -> None:
    trainer = sdk(api)
    listed = trainer.list_runtimes()
    assert [r.name for r in listed] == ["llm-train"], listed  # without the label: [] (skipped)
    runtime = trainer.get_runtime("llm-train")  # without the label: raises
    assert runtime.trainer.framework == "torch"
    assert runtime.trainer.num_nodes == 4
    assert runtime.trainer.trainer_type == kubeflow_types.TrainerType.CUSTOM_TRAINER
    name = trainer.train(
        runtime=runtime,
        trainer=kubeflow_types.CustomTrainerContainer(
            image="registry.example.com/ml/llm:3", env={"LR": "3e-4"}
        ),
    )
    [job] = api.created
    assert job["metadata"]["name"] == name
    assert SDK_NAME.fullmatch(name) and "llm-train" not in name, name
    spec = job["spec"]
    assert spec["runtimeRef"] == {"name": "llm-train", "kind": "ClusterTrainingRuntime"}
    # A container trainer sets no command: the runtime's `nvtrain run` stays.
    assert "command" not in spec["trainer"] and "args" not in spec["trainer"], spec["trainer"]
    assert spec["trainer"]["image"] == "registry.example.com/ml/llm:3"
