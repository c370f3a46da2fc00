"""The one model of a pod spec: pure functions over manifests (dicts as the API sends them, or as
YAML gives them), shared by the admission rules (``gpuzombie check``, the webhook), ``lab pod`` and
the node agent's reading of the kubelet's device assignments.

Three layers, each usable alone:

* text -> ``Document`` (``loader.load_documents``: multi-document YAML or JSON, with line numbers);
* document -> ``PodTemplate`` (``templates``): each pod-shaped object, located by a JSON pointer
  (``pointers``) in its document (``kind: List`` opened, the Pod itself, ``spec.template``, a
  CronJob's job template); a reader of custom resources (Ray, training operators,
  LeaderWorkerSet...) adds pointers in ``templates._template_pointers``;
* pod spec -> ``PodSpec`` (``model``): its containers of every kind (init, native sidecar, regular,
  ephemeral), each with its argv, literal env, preStop hook and the GPUs it asks for, and the pod's grace.

``model.read_pod_spec`` has two modes. Lenient (admission): a wrong type where the API takes a list or
a map is a ``fields.ManifestError``, anything else it cannot judge is left out (an env value from a
secret, an httpGet hook). Strict (the lab, which must run what it reads): names must be what the API
server takes (``fields``) and a hook exactly one handler; the caller refuses the fields it does not
apply by name.

GPU recognition is ``gpus.gpu_resource`` alone: every reader (admission, the lab, the kubelet's device
assignments) asks it. A container's GPUs are ``GpuRequest``s, so another way to ask for one (a DRA
claim in ``resources.claims``, resolved against the pod's ``resourceClaims``) adds requests, not a
second model.
"""
