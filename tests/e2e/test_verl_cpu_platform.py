"""The CPU platform fixture (tests/verl_cpu/platform.py) as verl's own code sees it: loaded by
``VERL_USE_EXTERNAL_MODULES`` on ``import verl`` and chosen by ``VERL_PLATFORM=cpu``, in a fresh process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tracklane.testing.server_process import free_port

ROOT = Path(__file__).resolve().parents[2]

_PROBE = """
import json
import torch
import verl  # loads the modules VERL_USE_EXTERNAL_MODULES names: the platform registers itself
from verl.plugin.platform.platform_manager import get_platform
from verl.utils import device
from verl.utils.distributed import initialize_global_process_group_ray
from verl.utils.flops_counter import get_device_flops

module = device.get_torch_device()
initialize_global_process_group_ray(timeout_second=60)  # verl's own default backend, on one rank
summed = torch.ones(3)
torch.distributed.all_reduce(summed)
free, total = module.mem_get_info()
module.manual_seed(7)
first = torch.rand(2).tolist()
module.manual_seed(7)
print(json.dumps({
    "platform": type(get_platform()).__name__, "device": device.get_device_name(),
    "resource": device.get_resource_name(), "collectives": device.get_nccl_backend(),
    "ipc": device.is_support_ipc(), "backend": torch.distributed.get_backend(), "summed": summed.tolist(),
    "memory": [free, total, module.memory_allocated(), module.max_memory_reserved()],
    "flops": get_device_flops(), "same_draw": first == torch.rand(2).tolist(),
    "ray_options": get_platform().ray_resource_options(1),
}))
"""


def test_verls_own_helpers_answer_for_the_cpu():
    """verl's device helpers name the cpu, gloo and a logical GPU for Ray; its own process-group start (whose default
    backend names the cpu twice) yields a working gloo group; memory figures come from the machine; its FLOPS
    table finds the CPU; seeding through the device module repeats a draw."""
    env = {**os.environ, "VERL_USE_EXTERNAL_MODULES": "tests.verl_cpu.platform", "VERL_PLATFORM": "cpu",
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "RANK": "0", "WORLD_SIZE": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH", "")]))}
    done = subprocess.run([sys.executable, "-c", _PROBE], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["platform"] == "CpuPlatform" and seen["device"] == "cpu"
    assert seen["resource"] == "GPU" and seen["ray_options"] == {"num_gpus": 1}
    assert seen["collectives"] == "gloo" and seen["ipc"] is False
    assert seen["backend"] == "cpu:gloo" and seen["summed"] == [1.0, 1.0, 1.0]
    free, total, allocated, reserved = seen["memory"]
    assert 0 < free <= total and allocated == reserved == 0
    assert seen["flops"] == 0.448 and seen["same_draw"] is True  # verl's table: "CPU" 448e9 FLOPS, 0.448 T


def test_the_readme_gives_the_command_ci_runs():
    """The README's "Use it from verl" block is the command tests/e2e/test_verl_main_ppo.py runs for tracklane's
    side (its variables, overrides and paths), so it cannot drift from what CI runs."""
    from tests.verl_cpu.main_ppo import ci_command

    readme = (ROOT / "README.md").read_text()
    block = "\n".join("  " + line for line in ci_command().splitlines())
    assert f"  ```bash\n{block}\n  ```" in readme
