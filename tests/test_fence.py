"""The fence's pure parts on fixtures: a ResourceSlice's devices (NVIDIA's layout and the DRA example
driver's, as the real API server returned it), rules told apart as its own or others', Prometheus's
answers into readings and clean streaks, and the decision: what is created, kept, deleted, held back.
The API talk and the scheduler are tests/kube/test_fence_kubernetes.py's."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpuzombie.fence.decide import Limits, Verdicts, decide, nodes_to_map
from gpuzombie.fence.model import (
    OWNER,
    OWNER_LABEL,
    TAINT_KEY,
    Device,
    Reading,
    Rule,
    parse_rule,
    render_rule,
    rule_name,
    slice_devices,
)
from gpuzombie.fence.verdicts import parse_readings, parse_streak, uuid_matcher

FIXTURES = Path(__file__).parent / "fixtures" / "fence"
MIB = 1024 * 1024
NODE = "gpu-node-7"


def devices(node: str = NODE, n: int = 8, driver: str = "gpu.nvidia.com") -> list[Device]:
    return [Device(driver, node, f"gpu-{i}", node, f"GPU-{node}-{i}") for i in range(n)]


def dirty(node: str = NODE, i: int = 0, mib: int = 2048, holder: str = "stale") -> Reading:
    return Reading(node, f"GPU-{node}-{i}", clean=False, held=((holder, mib * MIB),), at=1_790_000_000.0)


def clean(node: str = NODE, i: int = 0) -> Reading:
    return Reading(node, f"GPU-{node}-{i}", clean=True)


def busy(node: str = NODE, i: int = 0) -> Reading:
    return Reading(node, f"GPU-{node}-{i}", clean=False)


def own_rule(node: str = NODE, i: int = 0) -> Rule:
    device = devices(node)[i]
    obj = render_rule(device, dirty(node, i))
    obj["metadata"]["uid"] = f"uid-{node}-{i}"
    return parse_rule(obj)


def verdicts(*readings: Reading, streak: tuple[Reading, ...] = ()) -> Verdicts:
    return Verdicts({r.key: r for r in readings}, frozenset(r.key for r in streak))


# --- the API's objects ----------------------------------------------------------------------------


def test_nvidia_slice_devices_by_uuid():
    got = slice_devices(json.loads((FIXTURES / "resourceslice-nvidia.json").read_text()))
    assert [(d.name, d.uuid) for d in got] == [
        ("gpu-0", "GPU-8a3c0f52-1b7e-4d0a-9c61-2e5f7a9b3d10"),
        ("gpu-1", "GPU-6714d9e5-0c2a-4f3e-8b1d-7a9c5e2f4b61"),
        ("gpu-1-mig-9-0-1", None),  # a MIG device: parentUUID only, never matched by a GPU's UUID
    ]
    assert {(d.driver, d.pool, d.node) for d in got} == {("gpu.nvidia.com", NODE, NODE)}


def test_example_driver_slice_as_the_api_server_returned_it():
    """Recorded from the real cluster (tests/kube/test_fence_kubernetes.py): dra-example-driver v0.4.0."""
    got = slice_devices(json.loads((FIXTURES / "resourceslice-example-driver.json").read_text()))
    assert got and all(d.driver == "gpu.example.com" and d.uuid and d.uuid.startswith("gpu-") for d in got)
    assert [d.name for d in got] == [f"gpu-{i}" for i in range(len(got))]


def test_qualified_uuid_attribute():
    obj = {
        "spec": {
            "driver": "d.example",
            "pool": {"name": "p"},
            "devices": [{"name": "x", "attributes": {"d.example/uuid": {"string": "U"}}}],
        }
    }
    assert slice_devices(obj)[0].uuid == "U"


def test_rendered_rule():
    device, reading = devices()[3], dirty(i=3, mib=2048, holder="stale")
    rule = render_rule(device, reading)
    assert rule["apiVersion"] == "resource.k8s.io/v1" and rule["kind"] == "DeviceTaintRule"
    assert rule["metadata"]["labels"] == {OWNER_LABEL: OWNER}
    assert rule["metadata"]["annotations"] == {
        "gpuzombie.dev/node": NODE,
        "gpuzombie.dev/uuid": f"GPU-{NODE}-3",
        "gpuzombie.dev/holder": "stale",
        "gpuzombie.dev/held-mib": "2048",
        "gpuzombie.dev/dirty-since": "2026-09-21T14:13:20Z",
    }
    assert rule["spec"] == {
        "deviceSelector": {"driver": "gpu.nvidia.com", "pool": NODE, "device": "gpu-3"},
        "taint": {"key": TAINT_KEY, "value": "stale", "effect": "NoSchedule"},
    }
    assert rule["metadata"]["name"] == rule_name(device) and len(rule_name(device)) <= 63
    assert rule_name(device) != rule_name(devices()[4])


def test_rule_with_the_label_alone_is_not_own():
    """Someone's rule that copies the label but not the name or the taint key is not the fence's."""
    mine = render_rule(devices()[0], dirty())
    assert parse_rule(mine).own
    copied_label = {"metadata": {"name": "team-rule", "labels": {OWNER_LABEL: OWNER}}, "spec": mine["spec"]}
    assert not parse_rule(copied_label).own
    other_key = json.loads(json.dumps(mine))
    other_key["spec"]["taint"]["key"] = "example.com/broken"
    assert not parse_rule(other_key).own
    assert not parse_rule({"metadata": {"name": "x"}, "spec": {}}).own


# --- Prometheus's answers ---------------------------------------------------------------------------


def _series(value: float, uuid: str, node: str = NODE, at: float = 1_790_000_000.0, **labels: str) -> dict:
    return {"metric": {"UUID": uuid, "Hostname": node, "gpu": "0", **labels}, "value": [at, str(value)]}


def test_readings_join_the_two_series():
    got = parse_readings(
        [_series(0, "GPU-a"), _series(1, "GPU-b"), _series(0, "GPU-c"), _series(0, "GPU-m", GPU_I_ID="9")],
        [
            _series(512 * MIB, "GPU-a", holder="stale"),
            _series(2048 * MIB, "GPU-a", holder="ghost"),
            _series(64 * MIB, "GPU-m", GPU_I_ID="9", holder="stale"),
        ],
    )
    assert set(got) == {(NODE, "GPU-a"), (NODE, "GPU-b"), (NODE, "GPU-c")}  # MIG left out
    a = got[NODE, "GPU-a"]
    assert a.dirty and a.holder == "ghost" and a.held_bytes == 2560 * MIB and a.at == 1_790_000_000.0
    assert not got[NODE, "GPU-b"].dirty and got[NODE, "GPU-b"].clean
    assert not got[NODE, "GPU-c"].dirty and not got[NODE, "GPU-c"].clean  # busy: its own pod


def test_held_without_a_clean_series_is_no_reading():
    assert parse_readings([], [_series(MIB, "GPU-a", holder="stale")]) == {}


def test_streak_needs_every_point_clean():
    def matrix(uuid: str, *values: float) -> dict:
        return {
            "metric": {"UUID": uuid, "Hostname": NODE},
            "values": [[1000 + i, str(v)] for i, v in enumerate(values)],
        }

    got = parse_streak(
        [
            matrix("GPU-a", 1, 1, 1),
            matrix("GPU-b", 0, 1, 1),
            matrix("GPU-c", 1, 1),
            matrix("GPU-d", 1, 1, float("nan")),
        ],
        3,
    )
    assert got == {(NODE, "GPU-a")}  # b was dirty, c has a gap (missing data), d is NaN


def test_uuid_matcher_is_exact():
    assert uuid_matcher(["GPU-b", "GPU-a", "GPU-a"]) == "GPU-a|GPU-b"  # "\\-" is no escape PromQL knows
    assert uuid_matcher(['a.b"c']) == 'a\\\\.b\\"c'  # RE2's \\. then the string's own escapes
    assert uuid_matcher([]) == ""


# --- the decision ------------------------------------------------------------------------------------


def test_dirty_gpu_gets_one_rule():
    plan = decide(verdicts(dirty(i=2), clean(i=1), busy(i=3)), [], {NODE: devices()}, Limits())
    assert [(c.device.name, c.reading.uuid) for c in plan.create] == [("gpu-2", f"GPU-{NODE}-2")]
    assert not plan.delete and not plan.limited and not plan.unmapped


def test_fenced_gpu_is_not_fenced_twice():
    rule = own_rule(i=2)
    plan = decide(verdicts(dirty(i=2)), [rule], {}, Limits())
    assert not plan.create and plan.keep == (rule,)
    assert nodes_to_map(verdicts(dirty(i=2)), [rule]) == set()  # no slice read for it
    assert nodes_to_map(verdicts(dirty(i=2), dirty("other", 0)), [rule]) == {"other"}


def test_lifted_only_after_the_streak():
    rule = own_rule(i=2)
    assert decide(verdicts(clean(i=2)), [rule], {}, Limits()).keep == (rule,)  # clean now, not N times yet
    assert decide(verdicts(clean(i=2), streak=(clean(i=2),)), [rule], {}, Limits()).delete == (rule,)
    assert decide(verdicts(busy(i=2)), [rule], {}, Limits()).keep == (rule,)


def test_missing_verdict_keeps_the_rule():
    rule = own_rule(i=2)
    plan = decide(verdicts(), [rule], {}, Limits())
    assert plan.keep == (rule,) and plan.missing == (rule,) and not plan.delete


def test_others_rules_are_never_in_the_plan():
    mine = own_rule(i=0)
    theirs = Rule(
        "team-maintenance", "uid-x", "gpu.nvidia.com", NODE, "gpu-1", own=False, node=NODE, uuid=f"GPU-{NODE}-1"
    )
    plan = decide(verdicts(clean(i=0), clean(i=1), streak=(clean(i=0), clean(i=1))), [mine, theirs], {}, Limits())
    assert plan.delete == (mine,) and theirs not in plan.keep and plan.foreign_rules == 1
    # a dirty GPU whose device someone else tainted still gets the fence's own rule
    plan = decide(verdicts(dirty(i=1)), [theirs], {NODE: devices()}, Limits())
    assert [c.device.name for c in plan.create] == ["gpu-1"]


def test_unmapped_dirty_gpu():
    plan = decide(verdicts(dirty("cpu-node", 0)), [], {"cpu-node": []}, Limits())
    assert not plan.create and [h.reading.node for h in plan.unmapped] == ["cpu-node"]
    assert "no DRA device" in plan.unmapped[0].why


def test_limit_in_all_counts_kept_rules():
    rules = [own_rule(i=0), own_rule(i=1)]
    plan = decide(
        verdicts(dirty(i=0), dirty(i=1), dirty(i=2), dirty(i=3)), rules, {NODE: devices()}, Limits(max_devices=3)
    )
    assert [c.device.name for c in plan.create] == ["gpu-2"]
    assert [h.device.name for h in plan.limited if h.device] == ["gpu-3"]
    assert "3 fenced devices in all" in plan.limited[0].why


def test_deleted_rules_free_their_place():
    rule = own_rule(i=0)
    plan = decide(
        verdicts(clean(i=0), dirty(i=1), streak=(clean(i=0),)), [rule], {NODE: devices()}, Limits(max_devices=1)
    )
    assert plan.delete == (rule,) and [c.device.name for c in plan.create] == ["gpu-1"]


@pytest.mark.parametrize(
    ("percent", "n", "fenced"), [(50, 8, 4), (25, 8, 2), (30, 8, 2), (12.5, 8, 1), (10, 8, 0), (100, 8, 8), (50, 2, 1)]
)
def test_limit_per_node_rounds_down(percent, n, fenced):
    readings = [dirty(i=i) for i in range(n)]
    plan = decide(verdicts(*readings), [], {NODE: devices(n=n)}, Limits(max_node_percent=percent))
    assert len(plan.create) == fenced and len(plan.limited) == n - fenced


def test_limit_per_node_is_per_node():
    readings = [dirty(i=i) for i in range(4)] + [dirty("gpu-node-8", i) for i in range(4)]
    plan = decide(
        verdicts(*readings), [], {NODE: devices(), "gpu-node-8": devices("gpu-node-8")}, Limits(max_node_percent=25)
    )
    assert sorted((c.reading.node, c.device.name) for c in plan.create) == [
        ("gpu-node-7", "gpu-0"),
        ("gpu-node-7", "gpu-1"),
        ("gpu-node-8", "gpu-0"),
        ("gpu-node-8", "gpu-1"),
    ]


def test_devices_of_other_drivers_do_not_match():
    other = [Device("gpu.example.com", NODE, "gpu-0", NODE, "GPU-elsewhere")]
    plan = decide(verdicts(dirty(i=0)), [], {NODE: other}, Limits())
    assert not plan.create and plan.unmapped


# --- the kubeconfig and the CLI's refusals ---------------------------------------------------------


def test_kubeconfig_fields(tmp_path):
    from gpuzombie.k8s.apiserver import from_kubeconfig, in_cluster

    (tmp_path / "certs").mkdir()
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": "b",
        "clusters": [
            {"name": "one", "cluster": {"server": "https://10.0.0.1:6443", "certificate-authority": "certs/ca.pem"}},
            {"name": "two", "cluster": {"server": "https://api.example:443", "certificate-authority-data": "UEVN"}},
        ],
        "users": [{"name": "u", "user": {"token": "abc"}}, {"name": "v", "user": {"tokenFile": "/run/token"}}],
        "contexts": [
            {"name": "a", "context": {"cluster": "one", "user": "u"}},
            {"name": "b", "context": {"cluster": "two", "user": "v"}},
        ],
    }
    path = tmp_path / "config"
    path.write_text(yaml_dump(config))
    got = from_kubeconfig(path, tmp_path)
    assert (got.server, got.token, got.token_file) == ("https://api.example:443", None, "/run/token")
    assert Path(got.ca_file or "").read_bytes() == b"PEM"
    config["current-context"] = "a"
    path.write_text(yaml_dump(config))
    got = from_kubeconfig(path, tmp_path)
    assert got.ca_file == str(tmp_path / "certs" / "ca.pem") and got.token == "abc"
    sa = tmp_path / "sa"
    sa.mkdir()
    (sa / "token").write_text("t\n")
    got = in_cluster(sa, {"KUBERNETES_SERVICE_HOST": "fd00::1", "KUBERNETES_SERVICE_PORT": "443"})
    assert got.server == "https://[fd00::1]:443" and got.bearer() == "t"


def yaml_dump(obj: object) -> str:
    return json.dumps(obj)  # JSON is YAML


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--kubeconfig", "/nonexistent/config"], "cannot read the kubeconfig /nonexistent/config"),
        ([], "not in a pod with a service account token"),
    ],
)
def test_cli_refuses_in_one_line(args, message, capsys, monkeypatch):
    from gpuzombie.cli.main import main

    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    assert main(["fence", "--once", "--prometheus", "http://127.0.0.1:9", *args]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


def test_cli_api_server_unreachable_is_exit_2(tmp_path, capsys):
    from gpuzombie.cli.main import main

    config = {
        "current-context": "c",
        "clusters": [{"name": "k", "cluster": {"server": "https://127.0.0.1:9", "insecure-skip-tls-verify": True}}],
        "users": [{"name": "u", "user": {"token": "x"}}],
        "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}],
    }
    (tmp_path / "config").write_text(json.dumps(config))
    assert (
        main(
            [
                "fence",
                "--once",
                "--json",
                "--prometheus",
                "http://127.0.0.1:9",
                "--kubeconfig",
                str(tmp_path / "config"),
            ]
        )
        == 2
    )
    captured = capsys.readouterr()
    assert "unreachable" in captured.err and len(captured.err.strip().splitlines()) == 1


# --- the evaluation's order of calls (a recorder in place of the API server) ------------------------


class RecordingApi:
    """Records the fence's calls; answers lists from ``rules`` and ``slices``, refuses what ``fail`` names."""

    def __init__(self, rules: list[dict], slices: list[dict], fail: dict[str, int]) -> None:
        self.rules, self.slices, self.fail, self.log, self.calls, self.timeout = rules, slices, fail, [], 0, 1.0

    def list(self, path: str, **selectors: str):
        self.calls += 1
        self.log.append(("list", path.rsplit("/", 1)[-1]))
        return iter(self.rules if path.endswith("devicetaintrules") else self.slices)

    def _maybe_fail(self, name: str) -> None:
        from gpuzombie.k8s.apiserver import ApiError

        if name in self.fail:
            raise ApiError(f"refused {name}", self.fail[name], "InternalError")

    def create(self, path: str, obj: dict) -> dict:
        self.calls += 1
        self.log.append(("create", obj["metadata"]["name"]))
        self._maybe_fail(obj["metadata"]["name"])
        return obj

    def delete(self, path: str, *, uid: str) -> dict:
        self.calls += 1
        name = path.rsplit("/", 1)[-1]
        self.log.append(("delete", name))
        self._maybe_fail(name)
        return {}


class FixedVerdicts:
    def __init__(self, verdicts: Verdicts) -> None:
        self.now = verdicts

    def verdicts(self, now: float, **_: object) -> Verdicts:
        return self.now


def _fence(api: RecordingApi, v: Verdicts, limits: Limits):
    from gpuzombie.fence.controller import Fence, Settings

    settings = Settings(drivers=("gpu.nvidia.com",), limits=limits, interval=1)
    lines: list[str] = []
    return Fence(api, FixedVerdicts(v), settings, log=lines.append), lines  # type: ignore[arg-type]


def _slice(n: int) -> dict:
    devs = [{"name": f"gpu-{i}", "attributes": {"uuid": {"string": f"GPU-{NODE}-{i}"}}} for i in range(n)]
    return {"spec": {"driver": "gpu.nvidia.com", "pool": {"name": NODE}, "nodeName": NODE, "devices": devs}}


def _stored(i: int) -> dict:
    obj = render_rule(devices()[i], dirty(i=i))
    obj["metadata"]["uid"] = f"uid-{i}"
    return obj


def test_deletes_come_before_creates_and_a_failed_delete_keeps_its_place():
    v = verdicts(clean(i=0), dirty(i=1), dirty(i=2), streak=(clean(i=0),))
    api = RecordingApi([_stored(0)], [_slice(8)], {})
    fence, _ = _fence(api, v, Limits(max_devices=2))
    outcome = fence.evaluate()
    assert [c for c, _ in api.log] == ["list", "list", "delete", "create", "create"]
    assert outcome.api_calls == 5 and len(outcome.created) == 2 and outcome.deleted == (rule_name(devices()[0]),)
    api = RecordingApi([_stored(0)], [_slice(8)], {rule_name(devices()[0]): 500})
    fence, lines = _fence(api, v, Limits(max_devices=2))
    outcome = fence.evaluate()
    assert [c for c, _ in api.log] == ["list", "list", "delete", "create"]  # one create waits
    assert len(outcome.created) == 1 and outcome.errors and any(line.startswith("error: delete") for line in lines)


def test_a_create_refused_as_already_there_is_the_rule_wanted():
    name = rule_name(devices()[1])
    api = RecordingApi([], [_slice(8)], {})
    fence, _ = _fence(api, verdicts(dirty(i=1)), Limits())

    def already(path: str, obj: dict) -> dict:
        from gpuzombie.k8s.apiserver import ApiError

        api.log.append(("create", name))
        raise ApiError("exists", 409, "AlreadyExists")

    api.create = already  # type: ignore[method-assign]
    outcome = fence.evaluate()
    assert outcome.created == (name,) and not outcome.errors


def test_dry_run_calls_only_lists():
    api = RecordingApi([_stored(0)], [_slice(8)], {})
    from gpuzombie.fence.controller import Fence, Settings

    settings = Settings(drivers=("gpu.nvidia.com",), limits=Limits(), dry_run=True)
    v = verdicts(clean(i=0), dirty(i=1), streak=(clean(i=0),))
    outcome = Fence(api, FixedVerdicts(v), settings, log=print).evaluate()  # type: ignore[arg-type]
    assert {c for c, _ in api.log} == {"list"} and outcome.rules[0]["metadata"]["name"] == rule_name(devices()[1])
    assert [r.name for r in outcome.plan.delete] == [rule_name(devices()[0])]
