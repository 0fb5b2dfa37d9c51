"""Sandboxes: the backends (process, docker, fake), the runner channel and the images."""
