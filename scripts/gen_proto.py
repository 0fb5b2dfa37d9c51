"""Regenerate the committed protobuf/gRPC code from proto/.

Run: python scripts/gen_proto.py            (writes client/tooljail/v1/)
     python scripts/gen_proto.py --check    (exits 1 when the committed code is stale)

Needs grpcio-tools (the `gen` extra): its version is pinned so that the output is
byte-for-byte reproducible, which is what makes the --check meaningful.
"""

from __future__ import annotations

import argparse
import difflib
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTO_ROOT = ROOT / "proto"
OUT = ROOT / "client"
GENERATED_SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py")


def generate(out_dir: Path) -> list[Path]:
    """Run protoc (from grpcio-tools) over every .proto into out_dir."""
    from grpc_tools import protoc  # imported here: only this script needs grpcio-tools

    protos = sorted(str(p.relative_to(PROTO_ROOT)) for p in PROTO_ROOT.rglob("*.proto"))
    include = Path(protoc.__file__).parent / "_proto"
    args = [
        "protoc",
        f"-I{PROTO_ROOT}",
        f"-I{include}",
        f"--python_out={out_dir}",
        f"--pyi_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        *protos,
    ]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed")
    return sorted(p for p in out_dir.rglob("*") if p.name.endswith(GENERATED_SUFFIXES))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if the committed code is stale")
    ns = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tmp_dir = Path(tmp)
        stale: list[str] = []
        for fresh in generate(tmp_dir):
            rel = fresh.relative_to(tmp_dir)
            committed = OUT / rel
            new_text = fresh.read_text()
            old_text = committed.read_text() if committed.exists() else ""
            if new_text == old_text:
                continue
            if ns.check:
                stale.append(str(rel))
                sys.stdout.writelines(
                    list(
                        difflib.unified_diff(
                            old_text.splitlines(True),
                            new_text.splitlines(True),
                            f"committed/{rel}",
                            f"fresh/{rel}",
                        )
                    )[:40]
                )
            else:
                committed.parent.mkdir(parents=True, exist_ok=True)
                committed.write_text(new_text)
                print(f"wrote {committed.relative_to(ROOT)}")
        if stale:
            print(f"stale generated code: {', '.join(stale)}; run: python scripts/gen_proto.py")
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
