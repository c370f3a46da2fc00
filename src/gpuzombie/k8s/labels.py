"""The labels the kubelet puts on every CRI pod sandbox and container: how the runtime's objects
are named back to pods. Their own module so that the CRI client (``k8s.cri``, which writes them)
and the name lookup (``k8s.names``, which reads them through the client) depend on it, not on each
other."""

POD_NAME = "io.kubernetes.pod.name"
POD_NAMESPACE = "io.kubernetes.pod.namespace"
POD_UID = "io.kubernetes.pod.uid"
CONTAINER_NAME = "io.kubernetes.container.name"
SANDBOX_CONTAINER = "POD"
"""The container name a pod's sandbox (pause) gets, as in ``docker ps`` of a dockershim node."""
