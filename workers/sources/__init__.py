"""Readers of other trackers' runs, for ``tracklane migrate``: one file per source tracker."""
