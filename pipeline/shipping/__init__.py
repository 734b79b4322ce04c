"""Internal. The asynchronous path: buffer -> shipper thread -> spool -> Ray -> one lane actor per tracker."""
