#!/usr/bin/env python3
"""Writes a one-layer OCI image archive, as `ctr images import` takes it, from files given on
the command line: no registry, no daemon, no base image.

    oci-image.py OUT.tar NAME --file SRC:DEST[:MODE] ... [--entrypoint JSON] [--cmd JSON]
                 [--user UID:GID]

NAME is the image's reference (e.g. localhost/pause:test); each file lands at DEST (absolute)
owned by root, with MODE (octal, default 0755). The archive holds oci-layout, index.json and
the blobs; the index names the image with both the OCI ref annotation and containerd's.
"""

import argparse
import gzip
import hashlib
import io
import json
import os
import sys
import tarfile
import time


def blob(data: bytes) -> tuple[str, int]:
    return "sha256:" + hashlib.sha256(data).hexdigest(), len(data)


def layer(files: list[tuple[str, str, int]]) -> bytes:
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        dirs = set()
        for _, dest, _ in files:
            parts = dest.strip("/").split("/")[:-1]
            for i in range(1, len(parts) + 1):
                dirs.add("/".join(parts[:i]))
        for d in sorted(dirs):
            info = tarfile.TarInfo(d)
            info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o755, 0
            tar.addfile(info)
        for src, dest, mode in files:
            with open(src, "rb") as f:
                data = f.read()
            info = tarfile.TarInfo(dest.strip("/"))
            info.size, info.mode, info.mtime = len(data), mode, 0
            tar.addfile(info, io.BytesIO(data))
    return raw.getvalue()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("name")
    ap.add_argument("--file", action="append", default=[], help="SRC:DEST[:MODE]")
    ap.add_argument("--entrypoint")
    ap.add_argument("--cmd")
    ap.add_argument("--user", default="0:0")
    a = ap.parse_args()
    files = []
    for spec in a.file:
        parts = spec.split(":")
        if len(parts) not in (2, 3) or not parts[1].startswith("/"):
            print(f"oci-image.py: --file {spec}: SRC:DEST[:MODE] with an absolute DEST", file=sys.stderr)
            return 2
        files.append((parts[0], parts[1], int(parts[2], 8) if len(parts) == 3 else 0o755))
    tar_bytes = layer(files)
    diff_id = "sha256:" + hashlib.sha256(tar_bytes).hexdigest()
    gz = gzip.compress(tar_bytes, mtime=0)
    layer_digest, layer_size = blob(gz)
    config = {
        "architecture": {"x86_64": "amd64", "aarch64": "arm64"}.get(os.uname().machine, os.uname().machine),
        "os": "linux",
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(0)),
        "config": {"User": a.user, "Env": ["PATH=/usr/local/bin:/usr/bin:/bin"]},
        "rootfs": {"type": "layers", "diff_ids": [diff_id]},
    }
    if a.entrypoint:
        config["config"]["Entrypoint"] = json.loads(a.entrypoint)
    if a.cmd:
        config["config"]["Cmd"] = json.loads(a.cmd)
    config_bytes = json.dumps(config, sort_keys=True).encode()
    config_digest, config_size = blob(config_bytes)
    manifest = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                   "digest": config_digest, "size": config_size},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
                    "digest": layer_digest, "size": layer_size}],
    }
    manifest_bytes = json.dumps(manifest, sort_keys=True).encode()
    manifest_digest, manifest_size = blob(manifest_bytes)
    index = {
        "schemaVersion": 2,
        "manifests": [{
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "digest": manifest_digest, "size": manifest_size,
            "annotations": {"io.containerd.image.name": a.name,
                            "org.opencontainers.image.ref.name": a.name.rsplit(":", 1)[-1]},
        }],
    }
    tmp = a.out + ".tmp"
    with tarfile.open(tmp, "w") as out:
        def add(name, data):
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), 0o644, 0
            out.addfile(info, io.BytesIO(data))
        add("oci-layout", b'{"imageLayoutVersion":"1.0.0"}')
        add("index.json", json.dumps(index).encode())
        for digest, data in ((config_digest, config_bytes), (layer_digest, gz), (manifest_digest, manifest_bytes)):
            add("blobs/sha256/" + digest.split(":", 1)[1], data)
    os.replace(tmp, a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
