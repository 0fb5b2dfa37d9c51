"""Tools: the registry, the loader of tool files, in-daemon tools and the built-ins."""
