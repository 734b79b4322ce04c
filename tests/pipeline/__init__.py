"""The asynchronous and synchronous paths through Ray: shipper, lanes, lane actors, streams, producers, reductions,
delivery of every kind, the console, the CLI and the viewer."""
