"""Test helpers shipped with tracklane (like ``structlog.testing``), for its tests and benchmarks.

One job: let a test see what really happened. ``readers`` read back what each real tracker
(MLflow, SwanLab, TensorBoard, wandb) stored, record by record; ``mlflow_server`` starts and
stops a real local ``mlflow server`` (``python -m tracklane.testing.mlflow_server start|stop DIR``),
``tensorboard_server`` a real ``tensorboard --logdir``, both as process groups of their own (``server_process``);
``tcp_proxy`` puts a proxy that can be cut and restored in front of a server, to stage an outage;
``memory`` reads back what the ``memory`` test sink (workers/sinks/memory.py) got, from any process.

Nothing is imported here, and ``import tracklane`` never imports this package: a tracker SDK is
imported only by the reader module that needs it.
"""
