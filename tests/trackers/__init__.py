"""Each tracker's sink and reader against the real tracker (offline SDKs, a real MLflow server, TensorBoard event
files, a real Prometheus), read back record by record."""
