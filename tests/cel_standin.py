"""A STAND-IN for kube-apiserver's MutatingAdmissionPolicy plugin: no kube-apiserver can run here
(ADMISSION-NOTES.md), so a policy's CEL is evaluated by cel-python (celpy), an independent CEL
implementation, not cel-go, the API server's own.

What it adds to cel-python, each as the API server defines it (k8s.io/apiserver
pkg/admission/plugin/policy/mutating, pkg/cel/environment/base.go):
- ``lists.range(n)`` (cel-go's ext.Lists, in the API server's base environment since 1.34) and
  ``list.join(sep)`` (cel-go's ext.Strings): cel-python has neither;
- ``JSONPatch{op, path, value}`` and ``Object.<field path>{...}`` initializers, with the API server's
  check that a nested initializer's name is its field's path (CheckTypeNamesMatchFieldPathNames);
- ``variables.<name>``, evaluated when first used, each once;
- matchConditions (any false: the policy is skipped) and the binding's namespace and object selectors.

What it does not do: type-check expressions against the Pod's schema or estimate their cost (the API
server refuses a policy whose expressions do not compile, at creation); the patch is applied with
jsonpatch, not evanphx/json-patch.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any

import celpy
import jsonpatch
from celpy import celtypes

JSONPATCH_FIELDS = frozenset({"op", "path", "from", "value"})


class PolicyError(Exception):
    """A CEL error: the API server applies the policy's failurePolicy."""


class _Object(celtypes.MapType):
    """A value made by an ``Object.<path>{...}`` initializer; ``type_name`` is that path."""

    def __init__(self, type_name: str, fields: Mapping[str, Any]) -> None:
        super().__init__(dict(fields))
        self.type_name = type_name


class _TypeName(celtypes.MapType):
    """``Object`` and ``Object.spec.volumes``: selecting a field names a deeper type; ``{...}`` makes one."""

    def __init__(self, name: str) -> None:
        super().__init__()
        self.name = name

    def __getitem__(self, field: Any) -> _TypeName:
        return _TypeName(f"{self.name}.{field}")

    def __contains__(self, field: object) -> bool:
        return True

    def __call__(self, fields: Mapping[str, Any] | None) -> _Object:
        made = _Object(self.name, fields or {})
        for field, value in made.items():
            for item in value if isinstance(value, list) else [value]:
                if isinstance(item, _Object) and item.type_name != f"{self.name}.{field}":
                    raise ValueError(
                        f'type mismatch: unexpected type name "{item.type_name}", expected "{self.name}.{field}"'
                    )
        return made


def _jsonpatch(fields: Mapping[str, Any] | None) -> celtypes.MapType:
    fields = dict(fields or {})
    unknown = set(fields) - JSONPATCH_FIELDS
    if unknown or "op" not in fields or "path" not in fields:
        raise ValueError(f"JSONPatch takes op, path and value or from, not {sorted(fields)}")
    return celtypes.MapType(fields)


def _range(_lists: Any, n: Any) -> celtypes.ListType:
    return celtypes.ListType([celtypes.IntType(i) for i in range(int(n))])


def _join(items: Any, separator: Any = "") -> celtypes.StringType:
    return celtypes.StringType(str(separator).join(str(i) for i in items))


FUNCTIONS: dict[str, Callable[..., Any]] = {"range": _range, "join": _join}
"""cel-python resolves a method by its name alone: ``lists.range`` is ``range`` with ``lists`` as receiver."""


def to_json(value: Any) -> Any:
    """A CEL value as plain JSON data."""
    if isinstance(value, celtypes.BoolType):
        return bool(value)
    if isinstance(value, (celtypes.IntType, celtypes.UintType)):
        return int(value)
    if isinstance(value, celtypes.DoubleType):
        return float(value)
    if isinstance(value, str):
        return str(value)
    if isinstance(value, Mapping):
        return {str(k): to_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [to_json(v) for v in value]
    if value is None:
        return None
    raise TypeError(f"not JSON: {value!r}")


class _Variables(celtypes.MapType):
    """``variables``: each evaluated on first use, in the policy's order of definition."""

    def __init__(self, evaluate: Callable[[str], Any], names: list[str]) -> None:
        super().__init__()
        self._evaluate = evaluate
        self._names = names

    def __contains__(self, name: object) -> bool:
        return name in self._names

    def __getitem__(self, name: Any) -> Any:
        if not dict.__contains__(self, name):
            if name not in self._names:
                raise KeyError(name)
            dict.__setitem__(self, name, self._evaluate(str(name)))
        return dict.__getitem__(self, name)


_ENVIRONMENT = celpy.Environment()


@functools.cache
def _program(expression: str) -> Any:
    """The expression parsed once (cel-python's parse is most of its time)."""
    return _ENVIRONMENT.program(_ENVIRONMENT.compile(expression), functions=FUNCTIONS)


class Evaluator:
    """One pod (``object``) through one policy's CEL."""

    def __init__(self, spec: Mapping[str, Any], pod: Mapping[str, Any]) -> None:
        self.expressions = {v["name"]: v["expression"] for v in spec.get("variables", [])}
        self.variables = _Variables(self._variable, list(self.expressions))
        self.activation = {
            "object": celpy.json_to_cel(pod),
            "oldObject": None,
            "variables": self.variables,
            "lists": celtypes.MapType(),
            "Object": _TypeName("Object"),
            "JSONPatch": _jsonpatch,
        }

    def evaluate(self, expression: str) -> Any:
        try:
            result = _program(expression).evaluate(self.activation)
        except (celpy.CELEvalError, celpy.CELParseError, ValueError, TypeError) as exc:
            raise PolicyError(f"{type(exc).__name__}: {str(exc)[:500]}") from exc
        if isinstance(result, celpy.CELEvalError):
            raise PolicyError(str(result)[:500])
        return result

    def _variable(self, name: str) -> Any:
        return self.evaluate(self.expressions[name])


def _selects(selector: Mapping[str, Any] | None, labels: Mapping[str, str]) -> bool:
    """A LabelSelector (matchLabels and matchExpressions' In, NotIn, Exists, DoesNotExist) on ``labels``."""
    if not selector:
        return True
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for e in selector.get("matchExpressions") or []:
        key, op, values = e["key"], e["operator"], e.get("values") or []
        if op == "In" and labels.get(key) not in values:
            return False
        if op == "NotIn" and key in labels and labels[key] in values:
            return False
        if op == "Exists" and key not in labels:
            return False
        if op == "DoesNotExist" and key in labels:
            return False
    return True


def bound(binding: Mapping[str, Any], pod: Mapping[str, Any], namespace: str) -> bool:
    """Whether the binding's matchResources select ``pod`` in ``namespace`` (its only label being
    kubernetes.io/metadata.name, as the API server sets it)."""
    match = binding["spec"].get("matchResources") or {}
    namespace_labels = {"kubernetes.io/metadata.name": namespace}
    pod_labels = (pod.get("metadata") or {}).get("labels") or {}
    return _selects(match.get("namespaceSelector"), namespace_labels) and _selects(
        match.get("objectSelector"), pod_labels
    )


def admit(policy: Mapping[str, Any], binding: Mapping[str, Any], pod: dict[str, Any], namespace: str) -> dict[str, Any]:
    """``pod`` as the policy leaves it on CREATE in ``namespace``: unchanged where the binding or a
    matchCondition does not select it. A CEL error raises PolicyError (the API server would apply
    failurePolicy: the tests want to see it)."""
    spec = policy["spec"]
    if not bound(binding, pod, namespace):
        return pod
    if not all(bool(Evaluator(spec, pod).evaluate(c["expression"])) for c in spec.get("matchConditions", [])):
        return pod
    for mutation in spec["mutations"]:  # each sees the one before's result
        pod = jsonpatch.apply_patch(pod, to_json(Evaluator(spec, pod).evaluate(mutation["jsonPatch"]["expression"])))
    return pod


def patch_ops(policy: Mapping[str, Any], pod: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The first mutation's JSONPatch operations for ``pod`` (its matchConditions not consulted)."""
    evaluator = Evaluator(policy["spec"], pod)
    return list(to_json(evaluator.evaluate(policy["spec"]["mutations"][0]["jsonPatch"]["expression"])))
