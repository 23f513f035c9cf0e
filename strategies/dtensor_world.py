"""The process group behind the ``dtensor`` tensor world: one rank, gloo, on CPU.

Rules:

- The group starts on first use (:func:`mesh`), once per process: ``init_process_group('gloo',
  store=HashStore(), rank=0, world_size=1)``, an in-process store, so nothing listens on a port
  and no file is left behind; then ``DeviceMesh('cpu', [0])``.
- A default group that something else started is used as it is when its world size is 1 (and is
  never torn down here); any other world size is refused with ``RuntimeError``, before anything
  is built.
- :func:`close` destroys the group this module started (at interpreter exit at the latest) and
  forgets the mesh; the next :func:`mesh` starts a new one. A ``DTensor`` built on a closed mesh
  keeps its local values but must not be redistributed.
"""

from __future__ import annotations

import atexit
from typing import Any

_state: dict[str, Any] = {"mesh": None, "owned": False}


def mesh() -> Any:
    """The one-rank CPU ``DeviceMesh`` that ``dtensor`` trees are distributed over."""
    if _state["mesh"] is None:
        import torch.distributed as dist
        from torch.distributed.device_mesh import DeviceMesh

        if not dist.is_available():
            raise RuntimeError("the dtensor world needs torch.distributed, which this torch lacks")
        if dist.is_initialized():
            if dist.get_world_size() != 1:
                raise RuntimeError("the dtensor world runs on one rank; the default process group "
                                   f"has world size {dist.get_world_size()}")
        else:
            dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
            _state["owned"] = True
        _state["mesh"] = DeviceMesh("cpu", [0])
    return _state["mesh"]


def close() -> None:
    """Destroy the process group :func:`mesh` started, if any; forget the mesh."""
    import torch.distributed as dist

    if _state["owned"] and dist.is_initialized():
        dist.destroy_process_group()
    _state.update(mesh=None, owned=False)


def started() -> bool:
    """Whether a mesh is in use (:func:`mesh` ran and :func:`close` has not)."""
    return _state["mesh"] is not None


atexit.register(close)
