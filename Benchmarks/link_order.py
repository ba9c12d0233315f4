#!/usr/bin/env python3
"""Writes Sources/pickup/link-order.txt: the objects whose code `pickup get` runs, one symbol of
each, which the release link (Package.swift, Linux) places first and together.

Why: the statically linked executable has 35 MiB of code, and the kernel maps each page of it that
runs together with its neighbours (64 KiB at a time). The few thousand functions a download runs
are spread over hundreds of such windows: 20 MiB of the binary's code was resident during a 1 GiB
download (half the peak RSS), for about 2 MiB of functions actually run. Placed first, the objects
that hold them share windows: 13.6 MiB resident. (Without `-function-sections`, which only the
build command can set for dependencies, lld moves whole object files: one symbol names its object.)

How: nginx on loopback (TLS with a certificate made here, and plain http), a release build stripped
of its debug information (valgrind cannot read this toolchain's), callgrind on the workloads below
to list the functions that ran, and the release link's map to find their objects.

    swift build -c release --product pickup && python3 Benchmarks/link_order.py

(with the release build's flags after it, if any: `python3 Benchmarks/link_order.py -Xswiftc ...`).

Needs valgrind, nginx and openssl (apt-get install -y valgrind nginx openssl). A stale list costs
nothing but the gain: names no longer in the binary are ignored by the linker.
"""
import os, shutil, subprocess, sys, tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench  # noqa: E402  (nginx and the certificate, as the benchmark starts them)

ROOT = bench.ROOT
OUTPUT = os.path.join(ROOT, "Sources", "pickup", "link-order.txt")


def executed(binary, args, env, work):
    """The (mangled) names of the functions of `binary` that ran under callgrind, in the order it lists them."""
    out = os.path.join(work, "callgrind.out")
    subprocess.run(["valgrind", "--tool=callgrind", "--demangle=no", f"--callgrind-out-file={out}", "--dump-instr=no",
                    "--compress-strings=no", "--compress-pos=no", binary] + args,
                   env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True, timeout=900)
    names, obj = [], None
    with open(out, errors="replace") as f:
        for line in f:
            if line.startswith("ob="):
                obj = line[3:].strip()
            elif line.startswith("fn=") and obj and obj.endswith(os.path.basename(binary)):
                names.append(line[3:].strip())
    os.remove(out)
    return names


def objects_by_symbol(work, build_args):
    """Each text symbol's object file, from a map of the release link (mangled names, as the ordering
    file needs them: lld writes C++ names demangled in its map unless told not to)."""
    link_map = os.path.join(work, "link.map")
    subprocess.run(["swift", "build", "-c", "release", "--product", "pickup", "-Xlinker", f"-Map={link_map}", "-Xlinker", "--no-demangle"]
                   + build_args, cwd=ROOT, stdout=subprocess.DEVNULL, check=True, timeout=3600)
    owner, current = {}, None
    with open(link_map, errors="replace") as f:
        for line in f:
            parts = line.split(None, 4)
            if len(parts) == 5 and ":(" in parts[4]:
                current = parts[4].strip() if ":(.text" in parts[4] else None
            elif len(parts) == 5 and current and not parts[4].startswith((".", "/", "<")):
                owner[parts[4].strip()] = current
    return owner


def main():
    # Any arguments are the release build's own (the install command's flags, a scratch path).
    build_args = sys.argv[1:]
    work = tempfile.mkdtemp(prefix="pickup-order-")
    bin_path = subprocess.run(["swift", "build", "-c", "release", "--show-bin-path"] + build_args, cwd=ROOT,
                              capture_output=True, text=True, check=True, timeout=600).stdout.strip()
    release = os.path.join(bin_path, "pickup")
    stripped = os.path.join(work, "pickup")
    subprocess.run(["strip", "--strip-debug", "-o", stripped, release], check=True, timeout=300)
    site = os.path.join(work, "site")
    os.makedirs(os.path.join(site, "batch"))
    with open(os.path.join(site, "file.bin"), "wb") as f:
        f.write(os.urandom(8 << 20))
    for i in range(20):
        with open(os.path.join(site, "batch", f"{i}.bin"), "wb") as f:
            f.write(os.urandom(64 << 10))
    cert, key = bench.make_certificate(work)
    port, tls_port, status_port = bench.free_port(), bench.free_port(), bench.free_port()
    nginx = bench.start_nginx(work, site, port, status_port, tls=(tls_port, cert, key))
    try:
        names = []
        for n, (scheme, p) in enumerate((("https", tls_port), ("http", port))):
            base = f"{scheme}://127.0.0.1:{p}"
            listing = os.path.join(work, f"list-{scheme}")
            with open(listing, "w") as f:
                f.write("".join(f"{base}/batch/{i}.bin\n" for i in range(20)))
            trust = ["--ca-certificate", cert] if scheme == "https" else []
            for i, args in enumerate((["get", base + "/file.bin", "-o", os.path.join(work, f"out-{n}"), "-x", "8"],
                                      ["get", base + "/file.bin", "-o", os.path.join(work, f"one-{n}"), "-x", "1"],
                                      ["get", "-i", listing, "-d", os.path.join(work, f"batch-{n}"), "-j", "16"])):
                env = dict(os.environ, PICKUP_STATE_DIR=os.path.join(work, f"state-{n}-{i}"))
                names += executed(stripped, args + trust + ["-q"], env, work)
        names += executed(stripped, ["--version"], dict(os.environ), work)
        owner = objects_by_symbol(work, build_args)
        chosen, seen = [], set()
        for name in names:
            obj = owner.get(name)
            if obj and obj not in seen:
                seen.add(obj)
                chosen.append(name)
        with open(OUTPUT, "w") as f:
            f.write("".join(n + "\n" for n in chosen))
        print(f"{len(chosen)} objects of {len(set(owner.values()))} with code that ran, in {OUTPUT}")
    finally:
        nginx.terminate()
        nginx.wait(timeout=10)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
