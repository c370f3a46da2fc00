"""Admission-time fixes for GPU pods: the rules ``gpuzombie check`` reports and the mutation the
webhook (and ``webhook --patch``) applies, over plain pod specs (dicts as the API sends them).

- ``manifests``: pod specs out of Kubernetes manifests (any object with a pod template);
- ``rules``: pure functions over a pod spec -> findings, with the lab's measured cost as evidence;
- ``mutate``: the fix as explicit JSONPatch operations, idempotent through an annotation;
- ``review``: AdmissionReview v1 in, AdmissionReview out, never a crash; ``app``: its WSGI edge.
"""
