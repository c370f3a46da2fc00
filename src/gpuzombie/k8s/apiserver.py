"""The Kubernetes API server over its REST API, standard library only (the project has no
kubernetes-client dependency): credentials from a kubeconfig (client certificate or bearer token) or,
in a pod, from the mounted service account (the token read again for each connection: bound
tokens rotate). One keep-alive TLS connection, opened again after a failure; every request counted,
so a caller can say what one pass cost."""

from __future__ import annotations

import base64
import http.client
import json
import os
import ssl
import tempfile
import urllib.parse
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuzombie.errors import GpuzombieError

SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")
DEFAULT_TIMEOUT_S = 30.0
PAGE = 500
"""Items per list page (kubectl's default chunk size)."""


class ApiError(GpuzombieError):
    """A request the API server refused or could not be sent; one line, with the HTTP status (0: none)."""

    def __init__(self, message: str, status: int = 0, reason: str = "") -> None:
        super().__init__(message)
        self.http_status = status
        self.reason = reason


@dataclass(frozen=True)
class Credentials:
    """Where the API server is and who we are to it."""

    server: str
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    token: str | None = None
    token_file: str | None = None
    insecure: bool = False

    def bearer(self) -> str | None:
        if self.token_file:
            try:
                return Path(self.token_file).read_text().strip()
            except OSError as exc:
                raise ApiError(f"cannot read the token {self.token_file}: {exc.strerror}") from exc
        return self.token


def _materialised(data: str | None, path: str | None, base: Path, scratch: Path, name: str) -> str | None:
    """A kubeconfig field's file: ``path`` (relative to the kubeconfig), or ``data`` (base64) written to
    ``scratch`` (ssl loads certificates from files only)."""
    if data:
        target = scratch / name
        target.write_bytes(base64.b64decode(data))
        return str(target)
    if path:
        return str(base / path) if not os.path.isabs(path) else path
    return None


def from_kubeconfig(path: Path, scratch: Path) -> Credentials:
    """The current context's cluster and user (certificate, token or token file) of a kubeconfig."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise ApiError(f"cannot read the kubeconfig {path}: {exc.strerror}") from exc
    try:
        import yaml  # a kubeconfig is YAML (JSON is YAML too)

        config = yaml.safe_load(text) or {}
        contexts = {c["name"]: c["context"] for c in config.get("contexts") or []}
        context = contexts[config["current-context"]]
        cluster = next(c["cluster"] for c in config["clusters"] if c["name"] == context["cluster"])
        users = config.get("users") or []
        user: dict[str, Any] = next((u["user"] or {} for u in users if u["name"] == context.get("user")), {})
        server = cluster["server"]
    except ImportError as exc:
        raise ApiError(f"reading a kubeconfig needs PyYAML: {exc}") from exc
    except (yaml.YAMLError, KeyError, TypeError, StopIteration, AttributeError) as exc:
        raise ApiError(f"kubeconfig {path}: no usable current context ({type(exc).__name__}: {exc})") from exc
    base = path.parent
    return Credentials(
        server=server,
        ca_file=_materialised(
            cluster.get("certificate-authority-data"), cluster.get("certificate-authority"), base, scratch, "ca.pem"
        ),
        cert_file=_materialised(
            user.get("client-certificate-data"), user.get("client-certificate"), base, scratch, "client.pem"
        ),
        key_file=_materialised(user.get("client-key-data"), user.get("client-key"), base, scratch, "client.key"),
        token=user.get("token"),
        token_file=user.get("tokenFile"),
        insecure=bool(cluster.get("insecure-skip-tls-verify")),
    )


def in_cluster(root: Path = SERVICE_ACCOUNT, env: Mapping[str, str] = os.environ) -> Credentials:
    """The pod's service account, as client-go's rest.InClusterConfig reads it."""
    host, port = env.get("KUBERNETES_SERVICE_HOST"), env.get("KUBERNETES_SERVICE_PORT")
    if not host or not port or not (root / "token").is_file():
        raise ApiError(
            "not in a pod with a service account token (KUBERNETES_SERVICE_HOST, " + f"{root}/token): give --kubeconfig"
        )
    netloc = f"[{host}]" if ":" in host else host
    return Credentials(server=f"https://{netloc}:{port}", ca_file=str(root / "ca.crt"), token_file=str(root / "token"))


class ApiServer:
    """JSON requests to one API server; ``calls`` counts every request sent."""

    def __init__(self, credentials: Credentials, *, timeout: float = DEFAULT_TIMEOUT_S) -> None:
        self.credentials = credentials
        url = urllib.parse.urlsplit(credentials.server)
        if url.scheme != "https" or not url.hostname:
            raise ApiError(f"API server {credentials.server!r}: only https:// servers are supported")
        self.host, self.port, self.prefix = url.hostname, url.port or 443, url.path.rstrip("/")
        self.timeout = timeout
        self.context = ssl.create_default_context(cafile=credentials.ca_file)
        if credentials.insecure:
            self.context.check_hostname = False
            self.context.verify_mode = ssl.CERT_NONE
        if credentials.cert_file:
            try:
                self.context.load_cert_chain(credentials.cert_file, credentials.key_file)
            except (OSError, ssl.SSLError) as exc:
                raise ApiError(f"client certificate {credentials.cert_file}: {exc}") from exc
        self.calls = 0
        self._connection: http.client.HTTPSConnection | None = None

    @classmethod
    def connect(cls, kubeconfig: str | None) -> ApiServer:
        """From ``kubeconfig`` when given, else the pod's service account."""
        if kubeconfig is None:
            return cls(in_cluster())
        with tempfile.TemporaryDirectory(prefix="gpuzombie-kubeconfig-") as scratch:
            return cls(from_kubeconfig(Path(kubeconfig), Path(scratch)))  # ssl has read the files by now

    def close(self) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None

    def request(
        self, method: str, path: str, *, query: Mapping[str, str] | None = None, body: Any = None
    ) -> dict[str, Any]:
        """One request; the decoded reply, or ApiError with the API's own status message."""
        target = self.prefix + path + ("?" + urllib.parse.urlencode(query) if query else "")
        headers = {"Accept": "application/json", "User-Agent": "gpuzombie"}
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        token = self.credentials.bearer()
        if token:
            headers["Authorization"] = f"Bearer {token}"
        self.calls += 1
        try:
            if self._connection is None:
                self._connection = http.client.HTTPSConnection(
                    self.host, self.port, context=self.context, timeout=self.timeout
                )
            self._connection.request(method, target, body=data, headers=headers)
            response = self._connection.getresponse()
            raw = response.read()
        except (OSError, http.client.HTTPException) as exc:
            self.close()
            raise ApiError(f"{method} {path}: API server {self.host}:{self.port} unreachable: {exc}") from exc
        try:
            reply = json.loads(raw) if raw else {}
        except ValueError:
            reply = {}
        if not 200 <= response.status < 300:
            message = reply.get("message") if isinstance(reply, dict) else None
            raise ApiError(
                f"{method} {path}: {response.status} {message or response.reason}",
                response.status,
                reply.get("reason", "") if isinstance(reply, dict) else "",
            )
        if not isinstance(reply, dict):
            raise ApiError(f"{method} {path}: the API server answered no JSON object")
        return reply

    def list(
        self, path: str, *, label_selector: str | None = None, field_selector: str | None = None
    ) -> Iterator[dict[str, Any]]:
        """Every item of a collection, page by page (``limit`` and ``continue``)."""
        query = {"limit": str(PAGE)}
        if label_selector:
            query["labelSelector"] = label_selector
        if field_selector:
            query["fieldSelector"] = field_selector
        while True:
            page = self.request("GET", path, query=query)
            yield from page.get("items") or []
            token = (page.get("metadata") or {}).get("continue")
            if not token:
                return
            query = {**query, "continue": token}

    def create(self, path: str, obj: Mapping[str, Any]) -> dict[str, Any]:
        return self.request("POST", path, body=obj)

    def delete(self, path: str, *, uid: str) -> dict[str, Any]:
        """Delete the object at ``path`` only if it is still the one with ``uid`` (a precondition the
        API server checks: an object deleted and made again under the name is not touched)."""
        return self.request(
            "DELETE", path, body={"kind": "DeleteOptions", "apiVersion": "v1", "preconditions": {"uid": uid}}
        )
