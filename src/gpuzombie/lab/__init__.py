"""The lab: the original experiment's four scenarios as PID namespaces on one machine, measured.

``pod`` makes and deletes pods the way the kubelet does, ``sampler`` records memory held and the
events, ``metrics`` turns them into the original experiment's numbers, ``scenarios`` runs the steps, ``results``
writes the original experiment's results/ layout and ``report`` rebuilds comparison.md and the plots.
"""
