"""Internal. A tracker behind one narrow contract: the ``Sink`` base and its optional Protocols, the sink host
both paths share, the migration ``Source`` contract, and the registry of backend names (plug-ins live in ``workers/``)."""
