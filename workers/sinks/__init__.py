"""One sink per tracker (a plug-in behind ``tracklane.host.sink.Sink``), plus the shaping they share."""
