"""Kubernetes: a planned fleet as manifests, and the controller that runs inside the cluster.

Two halves with different needs:

- Manifests (`gpufleet deploy k8s`, `gpufleet plan --emit k8s`): plain data written as YAML;
  they need nothing beyond the core (`settings`, `placement`, `workload`, `gateway_objects`,
  `controller_objects`, `scalers`, `fleet_groups` (a fleet with `groups:`: one set per
  model group), `emit`).
- The in-cluster controller (`gpufleet controller k8s`): `KubernetesActuator`, the gateway
  peers, the Lease-based leader election. They talk to the API server through the official
  `kubernetes` client, which comes with the extra: `pip install 'gpufleet[k8s]'`.
"""

from __future__ import annotations

from types import ModuleType

from gpufleet.errors import UserError

INSTALL_HINT = "pip install 'gpufleet[k8s]'"


def require_client() -> ModuleType:
    """The `kubernetes` package, or a UserError that says how to install it."""
    try:
        import kubernetes
    except ImportError:
        raise UserError(
            "the Kubernetes client is not installed",
            field="kubernetes",
            fix=INSTALL_HINT,
        ) from None
    return kubernetes
