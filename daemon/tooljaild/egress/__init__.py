"""Egress: what sandboxes may reach outside, enforced by a proxy on the host."""
