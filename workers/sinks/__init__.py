"""One sink per tracker (a plug-in behind ``pipeline.host.sink.Sink``), plus the shaping they share."""
