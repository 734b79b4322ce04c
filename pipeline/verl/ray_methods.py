"""In a Ray worker, the runs an actor method leaves behind are finished before Ray reports the method done.

verl's ``RayPPOTrainer.fit`` keeps its ``Tracking`` in a local and returns without ``finish()``. With verl's
own config that local outlives the call: ``config.algorithm.get("gdpo_reward_keys")``, a key verl's
generated config lacks, leaves an OmegaConf exception in a reference cycle whose traceback holds ``fit``'s
frame, so the ``Tracking`` is freed by the cyclic collector only, at no set time (found with
``gc.DEBUG_SAVEALL``). In a ``TaskRunner`` actor the driver exits as soon as the method returns, and Ray
ends the actor 0.5-1.5 s later with no ``atexit`` and no finalizer run (measured here). So each actor method
of the worker is wrapped: after it returns, while a ``Tracking`` of the process is unfinished, one
``gc.collect()`` frees what the method dropped, and ``Tracking.__del__`` finishes it right there; if the
method raised, the runs held by the frames it left are finished as failed (Ray, not ``sys.excepthook``,
gets that exception). A method of an actor with no unfinished ``Tracking`` pays one extra call.

``install()`` patches Ray's ``FunctionActorManager._make_actor_method_executor`` (not public API; checked
against Ray 2.60), so actor classes loaded after it get the wrapper: run it before the actor class loads,
as Ray's ``worker_process_setup_hook`` does (``tracklane.verl.install`` calls it).
"""

from __future__ import annotations

import functools
import gc
import inspect
import logging
from collections.abc import Callable
from typing import Any

from tracklane.tracking import finish_left_by, has_unfinished

log = logging.getLogger("tracklane")
_WRAPPED = "__tracklane_finishes_dropped_runs__"


def install() -> bool:
    """Wrap the actor methods of the classes this Ray worker loads from now on; False where Ray has no such hook."""
    try:
        from ray._private.function_manager import FunctionActorManager
    except ImportError:
        return False
    make = getattr(FunctionActorManager, "_make_actor_method_executor", None)
    if make is None:
        log.warning("tracklane: this Ray has no FunctionActorManager._make_actor_method_executor; runs dropped by "
                    "an actor method are finished by the garbage collector only")
        return False
    if getattr(make, _WRAPPED, False):
        return True

    @functools.wraps(make)
    def make_executor(self: Any, method_name: str, method: Callable) -> Callable:
        return finishing_dropped_runs(make(self, method_name, method), method)

    setattr(make_executor, _WRAPPED, True)
    FunctionActorManager._make_actor_method_executor = make_executor  # type: ignore[method-assign]
    return True


def finishing_dropped_runs(executor: Callable, method: Callable) -> Callable:
    """``executor``, finishing afterwards the runs its call dropped (or, if it raised, left behind)."""
    if inspect.iscoroutinefunction(method) or inspect.isgeneratorfunction(method) \
            or inspect.isasyncgenfunction(method):
        return executor  # Ray drives these itself; their end is not the call's return

    def run(*args: Any, **kwargs: Any) -> Any:
        try:
            return executor(*args, **kwargs)
        except BaseException as exc:
            finish_left_by(exc)
            raise
        finally:
            if has_unfinished():
                gc.collect()  # a dropped Tracking in a reference cycle: its __del__ finishes it now

    run.__dict__.update(executor.__dict__)  # Ray reads .name and .method off the executor
    return run
