"""The lab's pod runtimes: ``pidns`` (PID namespaces the lab makes itself), ``cri`` (CRI pods on a
real runtime) and ``containerd`` (the private containerd those CRI pods run on). Lab
infrastructure only: the node agent (``k8s/``, the exporter) never imports it."""
