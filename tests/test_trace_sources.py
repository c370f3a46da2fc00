"""The name sources on their own: crictl's JSON shapes, and the PodResources wire format."""

from __future__ import annotations

import json

import pytest

from gpuzombie.k8s.cri import parse_inspect, parse_pods, parse_ps
from gpuzombie.k8s.podresources import PodResourcesError, parse_list_response

CID = "9ec39b91f3d70e1beff50a308f77067065ea6be0d91a3378375056cd4422cf3d"
LABELS = {
    "io.kubernetes.pod.name": "web",
    "io.kubernetes.pod.namespace": "prod",
    "io.kubernetes.pod.uid": "74c13223-5a00-11e9-b385-42010a80018d",
    "io.kubernetes.container.name": "app",
}


def test_ps_and_pods():
    ps = json.dumps(
        {
            "containers": [
                {
                    "id": CID,
                    "podSandboxId": "x",
                    "metadata": {"name": "app", "attempt": 0},
                    "state": "CONTAINER_RUNNING",
                    "labels": LABELS,
                }
            ]
        }
    )
    (c,) = parse_ps(ps)
    assert (c.container_id, c.container, c.pod, c.namespace, c.state) == (
        CID,
        "app",
        "web",
        "prod",
        "CONTAINER_RUNNING",
    )
    assert parse_ps('{"containers": null}') == []
    pods, sandboxes = parse_pods(
        json.dumps(
            {
                "items": [
                    {
                        "id": "s" * 64,
                        "state": "SANDBOX_READY",
                        "metadata": {
                            "name": "web",
                            "uid": LABELS["io.kubernetes.pod.uid"],
                            "namespace": "prod",
                            "attempt": 0,
                        },
                    }
                ]
            }
        )
    )
    assert (pods[0].pod, pods[0].namespace) == ("web", "prod")
    assert (sandboxes[0].container, sandboxes[0].pod) == ("POD", "web")


@pytest.mark.parametrize("shape", ["concatenated", "list"])
def test_inspect_of_several_ids(shape):
    docs = [
        {"status": {"id": CID, "metadata": {"name": "app"}, "labels": LABELS}, "info": {"pid": 42}},
        {"status": {"id": "e" * 64, "metadata": {"name": "sidecar"}, "labels": {}}},
    ]
    text = "\n".join(json.dumps(d, indent=2) for d in docs) if shape == "concatenated" else json.dumps(docs)
    got = parse_inspect(text)
    assert [(c.container_id[:1], c.container, c.pod) for c in got] == [("9", "app", "web"), ("e", "sidecar", None)]


def test_pod_resources_wire_format_errors():
    assert parse_list_response(b"") == ()
    with pytest.raises(PodResourcesError):
        parse_list_response(b"\x0a\x10short")  # a field longer than the message
    with pytest.raises(PodResourcesError):
        parse_list_response(b"\x0b")  # wire type 3 (groups) is not used by this API
