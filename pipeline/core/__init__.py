"""Internal. The floor every room stands on: records, errors, reports, acknowledgements, params (stdlib + numpy)."""
