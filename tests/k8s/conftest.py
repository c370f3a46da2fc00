"""Fixtures of the chart tests, shared by name."""

from k8s_support import default_objects as default_objects
