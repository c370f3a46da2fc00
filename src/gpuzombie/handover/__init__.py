"""Whether a GPU is clean to hand to the next pod: the one verdict that preflight (in the pod), the
exporter (on the node) and ``top`` share."""
