#!/usr/bin/env python3
"""Prints THIRD-PARTY-LICENSES: the Rust crates linked into librlock.so (rlock's normal
dependencies, transitively, without proc-macros and build-only crates, which run at build time
only), each with its license expression and the license files it ships.

Usage: third_party.py TARGET_TRIPLE > THIRD-PARTY-LICENSES (run from the workspace root, after
a build has fetched the crates)."""

import json
import os
import subprocess
import sys


def main() -> None:
    triple = sys.argv[1]
    meta = json.loads(
        subprocess.check_output(
            ["cargo", "metadata", "--format-version", "1", "--locked", "--filter-platform", triple]
        )
    )
    packages = {p["id"]: p for p in meta["packages"]}
    nodes = {n["id"]: n for n in meta["resolve"]["nodes"]}
    root = next(p["id"] for p in meta["packages"] if p["name"] == "rlock" and p["source"] is None)

    linked, todo = set(), [root]
    while todo:
        node = nodes[todo.pop()]
        for dep in node["deps"]:
            normal = any(k["kind"] is None for k in dep["dep_kinds"])
            pkg = packages[dep["pkg"]]
            macro = any("proc-macro" in t["kind"] for t in pkg["targets"])
            if normal and not macro and dep["pkg"] not in linked:
                linked.add(dep["pkg"])
                todo.append(dep["pkg"])

    out = [
        "Third-party code in librlock.so",
        "",
        "librlock.so (rlock, MIT: see LICENSE) statically links the following Rust crates",
        "(and the Rust standard library: MIT OR Apache-2.0). Each crate's license files follow.",
        "",
    ]
    chosen = sorted((packages[i] for i in linked), key=lambda p: (p["name"], p["version"]))
    for p in chosen:
        out.append(f"- {p['name']} {p['version']}: {p['license'] or p.get('license_file')}")
    for p in chosen:
        folder = os.path.dirname(p["manifest_path"])
        files = sorted(
            f
            for f in os.listdir(folder)
            if f.upper().startswith(("LICENSE", "LICENCE", "COPYING", "NOTICE"))
            and os.path.isfile(os.path.join(folder, f))
        )
        out += ["", "=" * 78, f"{p['name']} {p['version']} ({p['license']})", "=" * 78]
        if not files:
            out.append("(the crate ships no license file; its license is named above)")
        for f in files:
            with open(os.path.join(folder, f), encoding="utf-8", errors="replace") as fh:
                out += ["", f"--- {f} ---", "", fh.read().rstrip()]
    print("\n".join(out))


if __name__ == "__main__":
    main()
