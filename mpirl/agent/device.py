"""The learner's torch device: ``--device {auto,cpu,cuda,cuda:N}`` and ``--amp {off,bf16}``.

Only the learner trains on the device.  Actors and buffers keep their numpy (or one-thread CPU
torch) networks and receive the flat float32 WEIGHTS vector, which leaves the device once per
broadcast; the replay memory stays in host memory (docs/design.md, "A GPU learner").

``check`` runs on rank 0 before any rank starts work, and only when the choice needs torch to be
verified (``cuda...`` or ``--amp bf16``), so the default ``auto`` adds no torch import to the
start-up path of a CPU run; ``resolve`` turns the name into a ``torch.device`` in the learner.
"""

from __future__ import annotations

import platform
import re
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

_NAME = re.compile(r"^(auto|cpu|cuda(:\d+)?)$")


def valid_name(name: str) -> bool:
    return bool(_NAME.match(name))


def resolve(name: str, torch: Any) -> torch.device:
    """'auto' -> cuda when torch sees a GPU, else cpu; any other name as given (checked)."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(name)
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError(_no_cuda(name, torch))
        n = torch.cuda.device_count()
        if dev.index is not None and dev.index >= n:
            raise RuntimeError(
                f"device={name!r}: this machine has {n} CUDA device(s) "
                f"(cuda:0 .. cuda:{n - 1}); pass one of those or --device cpu"
            )
        if dev.index is None:
            dev = torch.device("cuda", torch.cuda.current_device())
    return dev


def _no_cuda(name: str, torch: Any) -> str:
    why = (
        "this torch is a CPU-only build"
        if torch.version.cuda is None
        else f"torch {torch.__version__} (CUDA {torch.version.cuda}) finds no CUDA device"
    )
    return (
        f"device={name!r}: {why}; run the learner on a host with a GPU and a CUDA build "
        "of torch, or pass --device cpu (or auto)"
    )


def check(device: str, amp: str) -> str:
    """The error text for a device choice this host cannot run, '' when it can (imports torch:
    call only when ``needs_check``)."""
    import torch

    try:
        dev = resolve(device, torch)
    except RuntimeError as e:
        return str(e)
    if amp != "off" and dev.type != "cuda":
        return (
            f"amp={amp!r} needs the learner on a CUDA device; --device {device} resolves to "
            f"{dev.type} here: pass --amp off (bf16 autocast on CPU is slower than float32 "
            "for these networks)"
        )
    return ""


def needs_check(device: str, amp: str) -> bool:
    return device.startswith("cuda") or amp != "off"


def describe(dev: torch.device, torch: Any) -> dict:
    """Name, memory and CUDA version of the learner's device (HDF5 attrs, start-up banner)."""
    if dev.type == "cuda":
        p = torch.cuda.get_device_properties(dev)
        return {
            "device": str(dev),
            "device_name": p.name,
            "device_memory_gib": round(p.total_memory / 2**30, 2),
            "torch_cuda": torch.version.cuda or "",
        }
    return {
        "device": "cpu",
        "device_name": _cpu_name(),
        "device_memory_gib": 0.0,
        "torch_cuda": torch.version.cuda or "",
    }


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass

    return platform.processor() or platform.machine()


def banner(info: dict, amp: str) -> str:
    if info["device"] == "cpu":
        return f"mpirl: learner on cpu ({info['device_name']})"
    return (
        f"mpirl: learner on {info['device']} ({info['device_name']}, "
        f"{info['device_memory_gib']:.1f} GiB, CUDA {info['torch_cuda']}), amp {amp}"
    )
