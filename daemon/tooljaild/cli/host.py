"""`tooljail doctor` and `tooljail images`: what this host provides for sandboxes."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from tooljaild.cli.common import (
    EXIT_OK,
    EXIT_TOOL_FAILED,
    EXIT_UNAVAILABLE,
    EXIT_USAGE,
    load_settings_or_exit,
)


def doctor(args: argparse.Namespace) -> int:
    from tooljaild.cli.doctor import check_docker, check_host, render, strict_ready

    settings = load_settings_or_exit(args.config, isolation=args.isolation)
    features = check_host(
        settings.isolation,
        bwrap=settings.sandbox.bwrap,
        sandbox_user=settings.sandbox.user,
        python=settings.sandbox.python,
    ) + check_docker(
        settings.docker.docker_host, backend=settings.backend, image=settings.docker.image
    )
    if args.json:
        print(json.dumps([f.__dict__ for f in features], indent=2))
    else:
        print(render(features, settings.isolation))
    return (
        EXIT_TOOL_FAILED if settings.isolation == "strict" and strict_ready(features) else EXIT_OK
    )


# ---------------------------------------------------------------------- images


def images(args: argparse.Namespace) -> int:
    from docker.errors import DockerException

    from tooljaild.sandbox.images import build as images

    specs: list[images.ImageSpec] = []
    if args.images_command == "build":
        try:
            specs = [images.spec_for(args.name)] if args.name else list(images.IMAGES.values())
            for spec in specs:  # raises for --scientific of an image without that variant
                images.build_args(spec, scientific=args.scientific)
        except images.ImageError as exc:
            print(f"tooljail: {exc}", file=sys.stderr)
            return EXIT_USAGE
    try:
        client = images.connect()
    except images.EngineUnavailableError as exc:
        print(f"tooljail: {exc}", file=sys.stderr)
        return EXIT_UNAVAILABLE
    try:
        if args.images_command == "list":
            return _images_list(client, as_json=args.json)
        for spec in specs:
            images.build(
                client,
                spec.name,
                scientific=args.scientific,
                force=args.force,
                log=lambda line: print(line, flush=True),
            )
    except images.ImageError as exc:
        print(f"tooljail: {exc}", file=sys.stderr)
        return EXIT_TOOL_FAILED
    except (DockerException, OSError) as exc:  # OSError: the connection broke
        print(f"tooljail: the Docker engine failed: {exc}", file=sys.stderr)
        return EXIT_TOOL_FAILED
    finally:
        client.close()
    return EXIT_OK


def _images_list(client: Any, *, as_json: bool) -> int:
    """Every image and variant: its tag, current / stale / missing, and size."""
    import dataclasses

    from tooljaild.sandbox.images import build as images

    rows = [
        images.image_status(client, name, scientific=scientific)
        for name, spec in sorted(images.IMAGES.items())
        for scientific in ((False, True) if spec.has_scientific else (False,))
    ]
    if as_json:
        print(json.dumps([dataclasses.asdict(s) for s in rows], indent=2))
        return EXIT_OK
    print(f"{'name':10} {'variant':11} {'tag':32} {'status':8} size")
    for s in rows:
        size = f"{s.size / 1e6:.0f} MB" if s.size is not None else "-"
        print(f"{s.name:10} {s.variant:11} {s.tag:32} {s.state.value:8} {size}")
    if any(s.state is not images.State.CURRENT for s in rows):
        print("\nbuild with: tooljail images build [NAME] [--scientific]")
    return EXIT_OK
