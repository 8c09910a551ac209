"""What ``vramscope run`` applies inside the watched script's Python.

``vramscope run -- python train.py`` starts Python with a ``sitecustomize.py`` of its own first
on ``PYTHONPATH``; that file imports this module and calls :func:`start_from_env` before the
script's first line. The settings come as JSON in ``VRAMSCOPE_RUN_CONFIG``, which is removed
from the environment at once, so the script's own child processes (data loader workers, a
nested ``python``) are not watched a second time and never overwrite its snapshot.
"""

from __future__ import annotations

import json
import os
from typing import Any, Dict, Optional

#: The environment variable ``vramscope run`` passes its settings in.
ENV_CONFIG = "VRAMSCOPE_RUN_CONFIG"


def start_from_env() -> Optional[Any]:
    """Applies the settings of ``VRAMSCOPE_RUN_CONFIG``, if set; returns the session."""
    text = os.environ.pop(ENV_CONFIG, None)
    if not text:
        return None
    return start(json.loads(text))


def start(config: Dict[str, Any]) -> Any:
    """Applies ``attach()`` (``allocator: "pytorch"``) or ``use_allocator()``
    (``"vramscope"``) with the snapshot, OOM snapshot, telemetry and metrics settings."""
    import vramscope

    allocator = config.get("allocator", "pytorch")
    if allocator == "vramscope":
        return vramscope.use_allocator(listen=config.get("listen"),
                                       snapshot_on_exit=config.get("snapshot"),
                                       metrics=config.get("metrics"))
    if allocator != "pytorch":
        raise ValueError(f"unknown allocator {allocator!r}: expected pytorch or vramscope")
    return vramscope.attach(listen=config.get("listen"),
                            snapshot_on_exit=config.get("snapshot"),
                            oom_snapshot=config.get("oom_snapshot"),
                            metrics=config.get("metrics"))
