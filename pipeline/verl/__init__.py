"""verl's extra loggers routed through ``Tracking``, and ``install()``: tracklane in place of verl's tracking classes."""


def install() -> None:
    """verl's hook: tracklane in place of verl's tracking classes in this process (``dropin.install``).
    Name it on verl's command line as ``worker_process_setup_hook=tracklane.verl.install``; imported when called,
    so ``import tracklane`` stays free of it."""
    from tracklane.verl.dropin import install as install_dropin

    install_dropin()


def uninstall() -> None:
    """verl's own classes back wherever ``install()`` put tracklane's (``dropin.uninstall``)."""
    from tracklane.verl.dropin import uninstall as uninstall_dropin

    uninstall_dropin()
