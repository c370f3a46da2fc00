"""Typed access to a manifest's fields, one message form: each reader names the field it
could not take (``spec.containers[0].args``) in a ``ManifestError``."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any


class ManifestError(ValueError):
    """Input that is not a manifest the reader takes: not YAML or JSON, a wrong type where the API
    takes a list or a map, or (strict) a value the API server would refuse. One line, naming the
    field (``spec.containers[0].args``) or the line."""


_JSON_TYPES = {bool: "true/false", int: "a number", float: "a number", str: "a string", list: "a list"}


def _shown_type(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, Mapping):
        return "a map"
    return _JSON_TYPES.get(type(value), type(value).__name__)


def mapping(value: object, where: str) -> Mapping[str, Any]:
    """``value`` as a map; absent (None) is empty."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ManifestError(f"{where} is not a map ({_shown_type(value)})")
    return value


def sequence(value: object, where: str) -> Sequence[Any]:
    """``value`` as a list; absent (None) is empty."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise ManifestError(f"{where} is not a list ({_shown_type(value)})")
    return value


def strings(value: object, where: str) -> tuple[str, ...]:
    """A list of strings (as the API takes ``command``, ``args``: a number is refused there too)."""
    items = sequence(value, where)
    if not all(isinstance(i, str) for i in items):
        raise ManifestError(f"{where} holds something other than strings")
    return tuple(items)


def integer(value: object, where: str, minimum: int | None = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or (minimum is not None and value < minimum):
        bound = "" if minimum is None else f" >= {minimum}"
        raise ManifestError(f"{where}: expected an integer{bound}, got {value!r}")
    return value


def boolean(value: object, where: str) -> bool:
    if not isinstance(value, bool):
        raise ManifestError(f"{where}: expected true or false, got {value!r}")
    return value


QUANTITY = re.compile(r"^([0-9]+(?:\.[0-9]+)?)(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E|m)?$")
SUFFIX = {
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
    "Pi": 2**50,
    "Ei": 2**60,
    "k": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
    "P": 10**15,
    "E": 10**18,
    "m": 1e-3,
}


def parse_quantity(value: object, where: str) -> float:
    """A Kubernetes quantity (``2Gi``, ``250m``, ``1``) as a number of base units."""
    m = QUANTITY.match(str(value).strip())
    if m is None or isinstance(value, bool):
        raise ManifestError(f"{where}: {value!r} is not a quantity the lab understands")
    return float(m.group(1)) * SUFFIX.get(m.group(2) or "", 1)


DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
DNS1123_LABEL_MAX = 63
DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
DNS1123_SUBDOMAIN_MAX = 253
"""The API server's name rules (k8s.io/apimachinery validation ``IsDNS1123Label`` and
``IsDNS1123Subdomain``): a namespace, a container and a volume name is a label, a pod name a
subdomain. A strict reader checks them, because the lab makes paths of them (the pod's log
directory, each container's log file, each emptyDir's directory)."""


def dns_label(value: object, where: str) -> str:
    """``value`` if it is a DNS-1123 label (a namespace, container or volume name)."""
    if not isinstance(value, str) or len(value) > DNS1123_LABEL_MAX or not DNS1123_LABEL.match(value):
        raise ManifestError(
            f"{where}: {value!r} is not a DNS-1123 label (at most {DNS1123_LABEL_MAX} lower-case letters, "
            "digits and '-', starting and ending with a letter or digit), as the API server requires"
        )
    return value


def dns_subdomain(value: object, where: str) -> str:
    """``value`` if it is a DNS-1123 subdomain (a pod name)."""
    if not isinstance(value, str) or len(value) > DNS1123_SUBDOMAIN_MAX or not DNS1123_SUBDOMAIN.match(value):
        raise ManifestError(
            f"{where}: {value!r} is not a DNS-1123 subdomain (at most {DNS1123_SUBDOMAIN_MAX} lower-case "
            "letters, digits, '-' and '.', each part starting and ending with a letter or digit), as the "
            "API server requires"
        )
    return value
