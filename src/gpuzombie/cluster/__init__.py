"""A real single-node Kubernetes on this machine, for the lab and the tests: the upstream control
plane and kubelet (one multi-call binary built from their Go modules, ``go/kube``), etcd, a private
containerd and CNI bridge networking. ``gpuzombie cluster up`` starts it, ``down`` removes every
trace of it. Never imported by the node agent: it is the bench the agent is proven on."""
