"""rlfleet: typed Python clients of the rlfleet services (controller, trainer, rollout,
buffer) over their gRPC contracts (proto/rlfleet/v1, generated into rlfleet.v1 when the
package is built)."""
from rlfleet.client import ROLES, Buffer, Controller, Generation, RlfleetError, Rollout, Trainer

__all__ = ["ROLES", "Buffer", "Controller", "Generation", "RlfleetError", "Rollout", "Trainer"]
__version__ = "0.1.0"
