"""The sandbox images: offline builds of the Dockerfiles and their base."""
