"""``tracklane view PATH``: a local web page for a run's rollouts (``run_data.py`` reads, ``server.py`` serves,
``static/`` is the page)."""
