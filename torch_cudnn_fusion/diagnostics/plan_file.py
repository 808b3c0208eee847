"""Plan files: save the built cuDNN plans and the autotune decisions, load them in a later run instead of building
and timing again.

The file is JSON: a header naming the environment the plans were built in (GPU model, compute capability, cuDNN,
cudnn-frontend, torch_cudnn_fusion and torch versions), the plans (each with its configuration, the engine in use, what
autotune measured, and cuDNN's serialized plan where cuDNN supports it) and a SHA-256 of the plans. A file from another
environment, or one that does not parse or whose checksum fails, is ignored with a PlanFileWarning and the plans are
built afresh: never an error, never a plan built for other hardware.

With TORCH_CUDNN_FUSION_PLAN_CACHE=path, the file is loaded when the extension loads (if it exists) and saved at exit.
"""

from __future__ import annotations

import atexit
import base64
import hashlib
import json
import os
import tempfile
import warnings
from typing import Union

import torch

from .. import _extension
from .. import policy as _policy  # noqa: F401 (its load hook sets the tuning every key holds: it must run first)

FORMAT = "torch_cudnn_fusion plan file"
FORMAT_VERSION = 2  # 2: a key holds its graph family's shape, and the benchmark tuning in its policy
ENVIRONMENT_VARIABLE = "TORCH_CUDNN_FUSION_PLAN_CACHE"


class PlanFileWarning(UserWarning):
    """A plan file (or some plans in it) could not be used; the plans are built afresh."""


def environment(device: Union[int, None] = None) -> dict:
    """What a plan file is keyed on: plans load only where every field matches."""
    from .. import __version__

    module = _extension.require()
    device = torch.cuda.current_device() if device is None else device
    major, minor = torch.cuda.get_device_capability(device)
    return {
        "gpu": torch.cuda.get_device_name(device),
        "compute_capability": f"{major}.{minor}",
        "cudnn": module.cudnn_version(),
        "cudnn_frontend": module.frontend_version(),
        "torch_cudnn_fusion": __version__,
        "torch": torch.__version__,
    }


def _encode(plan: dict) -> dict:
    out = dict(plan)
    out["serialized"] = base64.b64encode(plan["serialized"]).decode("ascii")
    return out


def _digest(plans: list) -> str:
    return hashlib.sha256(json.dumps(plans, sort_keys=True).encode()).hexdigest()


def save_plan_cache(path: Union[str, os.PathLike]) -> int:
    """Writes every built plan in the cache to `path` (atomically: a partial file never replaces a good one).
    Returns the number of plans written."""
    plans = [_encode(p) for p in _extension.require().saved_plans()]
    document = {"format": FORMAT, "version": FORMAT_VERSION, "environment": environment(), "plans": plans,
                "sha256": _digest(plans)}
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", dir=directory, prefix=".plans-", suffix=".tmp", delete=False) as tmp:
        json.dump(document, tmp)
    os.replace(tmp.name, path)
    return len(plans)


def _reject(path: str, why: str) -> int:
    warnings.warn(f"torch_cudnn_fusion: ignoring the plan file {path}: {why}; plans will be built afresh",
                  PlanFileWarning, stacklevel=3)
    return 0


def load_plan_cache(path: Union[str, os.PathLike]) -> int:
    """Loads the plans of a file written by save_plan_cache into the plan cache. Returns how many were loaded. A
    missing, corrupt or foreign file (another GPU model, compute capability, cuDNN, cudnn-frontend or package
    version) loads nothing and warns (PlanFileWarning); so does each plan that cannot be loaded."""
    path = os.fspath(path)
    module = _extension.require()
    try:
        with open(path, "rb") as f:
            document = json.loads(f.read().decode("utf-8"))
    except FileNotFoundError:
        return _reject(path, "it does not exist")
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        return _reject(path, f"it is corrupt ({type(error).__name__}: {error})")
    if not isinstance(document, dict) or document.get("format") != FORMAT:
        return _reject(path, "it is not a torch_cudnn_fusion plan file")
    if document.get("version") != FORMAT_VERSION:
        return _reject(path, f"its format version is {document.get('version')!r}, this package reads {FORMAT_VERSION}")
    plans = document.get("plans")
    if not isinstance(plans, list) or document.get("sha256") != _digest(plans):
        return _reject(path, "it is corrupt (its checksum does not match its plans)")
    saved_environment = document.get("environment") or {}
    current = environment()
    different = [f"{name} {saved_environment.get(name)!r} (this process: {value!r})"
                 for name, value in current.items() if saved_environment.get(name) != value]
    if different:
        return _reject(path, "it was written in another environment: " + "; ".join(different))
    loaded, problems = 0, []
    for number, plan in enumerate(plans):
        try:
            entry = dict(plan)
            entry["serialized"] = base64.b64decode(plan["serialized"], validate=True)
            why = module.load_saved_plan(entry)
        except Exception as error:  # noqa: BLE001 — a malformed entry is skipped, never fatal
            why = f"{type(error).__name__}: {error}"
        if why:
            problems.append(f"plan {number} ({plan.get('graph', '?') if isinstance(plan, dict) else '?'}): {why}")
        else:
            loaded += 1
    if problems:
        shown = "; ".join(problems[:3]) + (f"; and {len(problems) - 3} more" if len(problems) > 3 else "")
        warnings.warn(f"torch_cudnn_fusion: {len(problems)} of {len(plans)} plans in {path} were not loaded and will "
                      f"be built afresh: {shown}", PlanFileWarning, stacklevel=2)
    return loaded


_auto_started = False


def start_automatic_plan_cache() -> None:
    """With TORCH_CUDNN_FUSION_PLAN_CACHE set: load that file now (when it exists) and save it at exit. Called when
    the extension loads."""
    global _auto_started
    path = os.environ.get(ENVIRONMENT_VARIABLE, "")
    if _auto_started or not path or not torch.cuda.is_available():
        return
    _auto_started = True
    if os.path.exists(path):
        load_plan_cache(path)

    def save_at_exit() -> None:
        try:
            save_plan_cache(path)
        except Exception as error:  # noqa: BLE001 — exiting: report, do not raise
            warnings.warn(f"torch_cudnn_fusion: could not save the plan file {path}: {error}", PlanFileWarning)

    atexit.register(save_at_exit)


_extension.call_when_loaded(start_automatic_plan_cache)
