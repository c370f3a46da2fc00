"""Admission-time fixes for GPU pods: the rules ``gpuzombie check`` reports and the mutation the
webhook (and ``webhook --patch``) applies, over plain pod specs (dicts as the API sends them).

- ``rules``: pure functions over a pod spec (read by ``k8s.podspec``, which also finds the pod
  templates in manifests) -> findings, with the lab's measured cost as evidence; ``pid1``: what a
  container's argv makes PID 1, its shell scripts split by ``shell``;
- ``mutate``: the fix as explicit JSONPatch operations, idempotent through an annotation;
- ``review``: AdmissionReview v1 in, AdmissionReview out, never a crash; ``app``: its WSGI edge.
"""
