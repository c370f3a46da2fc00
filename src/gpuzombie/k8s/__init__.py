"""Kubernetes and container-runtime knowledge: cgroup paths, CRI names, kubelet PodResources."""
