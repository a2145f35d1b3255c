"""The selftest's launch checks on a real GPU: the cases hand host (CPU) tensors to their
launcher, as they do on the emulator; this backend copies each to the device, launches the
cached code object through HIP on torch's current stream, waits, and copies every tensor back
into the caller's (so outputs written through views reach the case's tensors)."""

from __future__ import annotations

from typing import Any, Mapping

import torch

from ..runtime.backends import HipBackend, Kernel
from ..templates.kernargs import LaunchMeta
from ..spec import Spec
from ..templates import Template


class DeviceBackend:
    """HipBackend for host tensors: each launch runs on `cuda:<device>` with copies of them."""

    name = "hip"
    needs_cache = True

    def __init__(self, device: int = 0, hip: HipBackend | None = None) -> None:
        self.device = torch.device("cuda", device)
        self.hip = hip or HipBackend()
        self.last_report: Any = None  # the device counts no instructions (the emulator's report)

    def load(self, template: Template, spec: Spec, meta: LaunchMeta | None, hsaco: bytes | None) -> Kernel:
        return self.hip.load(template, spec, meta, hsaco)

    def expose(self, name: str, memory: Any, writable: bool) -> None:
        self.hip.expose(name, memory, writable)

    def peers_elsewhere(self, wait_seconds: float) -> None:
        self.hip.peers_elsewhere(wait_seconds)

    def launch(self, kernel: Kernel, values: Mapping[str, Any], stream: int) -> None:
        on_device = {name: value.to(self.device) if isinstance(value, torch.Tensor) else value
                     for name, value in values.items()}
        with torch.cuda.device(self.device):
            self.hip.launch(kernel, on_device, torch.cuda.current_stream().cuda_stream)
            torch.cuda.synchronize()
        for name, value in values.items():
            if isinstance(value, torch.Tensor) and value.numel():
                value.copy_(on_device[name].cpu())
