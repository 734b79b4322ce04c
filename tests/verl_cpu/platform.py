"""A CPU platform for verl 0.9.1, so verl's own ``main_ppo`` runs on a machine without a GPU (issue 46).

verl has no CPU platform: its platform manager falls back to "nvidia". It imports the modules named in
``VERL_USE_EXTERNAL_MODULES`` on ``import verl``, in the driver and in every Ray worker, and ``VERL_PLATFORM=cpu``
then selects the platform this module registers. Nothing in verl's wheel is edited; one function's default is
wrapped here (``_gloo_only``).

What verl asks of a platform, and the CPU answers:
- devices: one, "cpu", through ``torch.cpu`` plus what it lacks (memory statistics, ``empty_cache``,
  ``mem_get_info`` from psutil, the RNG state, ``get_device_name``), see ``cpu_device_module``;
- collectives: gloo; Ray's resource: "GPU", because verl's resource pools count only GPU or NPU (give Ray a logical
  ``num_gpus``);
- no CUDA IPC: weights reach the rollout engine by verl's shared-memory path.
"""

from __future__ import annotations

import contextlib
import functools
import types
from collections.abc import Iterator
from typing import Any

import torch
from verl.plugin.platform.platform_base import PlatformBase
from verl.plugin.platform.platform_manager import PlatformRegistry

NAME = "cpu"


def _zero(*_args: Any, **_kwargs: Any) -> int:
    return 0


def _nothing(*_args: Any, **_kwargs: Any) -> None:
    return None


def _seed(seed: int) -> None:
    torch.manual_seed(seed)


def _mem_get_info(*_args: Any) -> tuple[int, int]:
    """(free, total) bytes, as ``torch.cuda.mem_get_info`` answers: the machine's memory."""
    import psutil

    memory = psutil.virtual_memory()
    return memory.available, memory.total


def cpu_device_module() -> types.ModuleType:
    """``torch.cpu`` with the ``torch.cuda`` calls verl makes on its device module and ``torch.cpu`` lacks."""
    module = types.ModuleType("verl_cpu_device")
    for name in dir(torch.cpu):
        if not name.startswith("_"):
            setattr(module, name, getattr(torch.cpu, name))
    for name in ("memory_allocated", "max_memory_allocated", "memory_reserved", "max_memory_reserved"):
        setattr(module, name, _zero)
    for name in ("empty_cache", "reset_peak_memory_stats", "ipc_collect", "set_per_process_memory_fraction"):
        setattr(module, name, _nothing)
    module.manual_seed = module.manual_seed_all = _seed
    module.mem_get_info = _mem_get_info
    module.get_rng_state = lambda *_args: torch.get_rng_state()
    module.set_rng_state = lambda state, *_args: torch.set_rng_state(state)
    module.get_device_name = lambda *_args: "CPU"  # verl/utils/flops_counter.py asks it for its FLOPS table
    module.set_device = _nothing  # torch.cpu.set_device refuses anything but "cpu"; verl passes an index
    module.current_device = _zero
    module.device_count = lambda: 1
    module.is_available = lambda: True
    return module


@PlatformRegistry.register(platform=NAME)
class CpuPlatform(PlatformBase):
    """verl's platform interface answered for a CPU-only machine."""

    def __init__(self) -> None:
        self._module = cpu_device_module()

    @property
    def device_name(self) -> str:
        return "cpu"

    @property
    def vendor_name(self) -> str:
        return "cpu"

    @property
    def device_module(self) -> types.ModuleType:
        return self._module

    def is_available(self) -> bool:
        return True

    def is_platform_available(self, use_smi_check: bool = False) -> bool:
        return False  # chosen by VERL_PLATFORM=cpu only, never by verl's auto-detection

    def current_device(self) -> Any:
        """verl passes this where a device goes (``model.to(get_device_id())``, ``device=get_device_id()``): an
        index there means an accelerator, so the answer is the device itself."""
        return "cpu"

    def device_count(self) -> int:
        return 1

    def set_device(self, device_index: int) -> None:
        return None

    def synchronize(self, device_index: int | None = None) -> None:
        return None

    def manual_seed(self, seed: int) -> None:
        _seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        _seed(seed)

    def set_allocator_settings(self, settings: str) -> None:
        return None

    def empty_cache(self) -> None:
        return None

    def get_device_capability(self, device_index: int = 0) -> tuple[int | None, int | None]:
        return None, None

    def communication_backend_name(self) -> str:
        return "gloo"

    def visible_devices_envvar(self) -> str:
        return "CUDA_VISIBLE_DEVICES"  # Ray sets it for a logical GPU; nothing reads it on the CPU

    @contextlib.contextmanager
    def nvtx_range(self, msg: str) -> Iterator[None]:
        yield

    def profiler_start(self) -> None:
        return None

    def profiler_stop(self) -> None:
        return None

    def ray_resource_name(self) -> str:
        return "GPU"

    def ray_noset_envvars(self) -> list[str]:
        return []

    def is_ipc_supported(self) -> bool:
        return False

    def cudart(self) -> Any:
        return None


def _gloo_only() -> None:
    """verl builds the process group's backend as ``cpu:gloo,<device>:<backend>``; on the CPU that names the cpu
    device twice, which torch refuses ("Duplicate device type cpu"): default it to ``cpu:gloo`` instead."""
    from verl.utils import distributed

    original = distributed.initialize_global_process_group_ray
    if getattr(original, "_verl_cpu", False):
        return

    @functools.wraps(original)
    def initialize(timeout_second: Any = None, backend: str | None = None) -> Any:
        return original(timeout_second=timeout_second, backend=backend or "cpu:gloo")

    initialize._verl_cpu = True  # type: ignore[attr-defined]
    distributed.initialize_global_process_group_ray = initialize


_gloo_only()
