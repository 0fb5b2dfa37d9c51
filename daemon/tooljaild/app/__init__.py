"""Composition and process life: the daemon, listeners, reload, pools, metrics, systemd, logs."""
