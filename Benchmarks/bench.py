#!/usr/bin/env python3
"""Pickup against aria2c, axel, curl and wget on the same work, from nginx on loopback.

Starts nginx, generates the files, runs every tool on every case several times in alternating
order and prints the median wall time, CPU time (user+sys) and peak RSS of each, with ratios.
Outputs go to tmpfs (/dev/shm) so that the disk is not what is measured.

    swift build -c release && python3 Benchmarks/bench.py            # all cases, 5 runs
    python3 Benchmarks/bench.py --runs 3 --cases single,throttled     # a subset
"""
import argparse, hashlib, os, shutil, socket, statistics, subprocess, sys, tempfile, time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MiB = 1024 * 1024


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def start_nginx(work, site, port):
    conf = f"""
{'user root;' if os.geteuid() == 0 else ''}
daemon off; master_process off; worker_processes 1;
pid {work}/nginx.pid; error_log {work}/error.log warn;
events {{ worker_connections 4096; }}
http {{
    access_log off; sendfile on; tcp_nopush on; keepalive_requests 100000;
    client_body_temp_path {work}/body; proxy_temp_path {work}/proxy; fastcgi_temp_path {work}/fcgi;
    # The connection that asks for the start of the file is ten times slower than the others.
    map $http_range $skew_rate {{ "~^bytes=0-" 2m; default 20m; }}
    server {{
        listen 127.0.0.1:{port};
        root {site};
        location /throttled/ {{ alias {site}/; limit_rate 20m; }}
        location /skewed/ {{ alias {site}/; limit_rate $skew_rate; }}
    }}
}}
"""
    path = os.path.join(work, "nginx.conf")
    with open(path, "w") as f:
        f.write(conf)
    proc = subprocess.Popen(["nginx", "-p", work, "-c", path, "-e", f"{work}/error.log"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(200):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.1).close()
            return proc
        except OSError:
            time.sleep(0.05)
    raise SystemExit("nginx did not start: " + open(f"{work}/error.log").read())


def run(cmd, env=None):
    """Runs a command; returns (wall seconds, cpu seconds, peak RSS in MiB, exit status)."""
    start = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.monotonic() - start
    err = proc.stderr.read().decode(errors="replace")
    proc.stderr.close()
    code = os.waitstatus_to_exitcode(status)
    if code != 0:
        print(f"  ! {' '.join(cmd)} exited {code}: {err.strip()[:300]}", file=sys.stderr)
    return wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024, code


def tools(pickup, conns, url, out):
    d, name = os.path.dirname(out), os.path.basename(out)
    t = {"pickup": [pickup, "get", url, "-o", out, "-q", "--overwrite"] + (["-x", str(conns)] if conns > 1 else [])}
    if shutil.which("aria2c"):
        t["aria2c"] = ["aria2c", "-q", f"-x{conns}", f"-s{conns}", "-k1M", "--file-allocation=none",
                       "--allow-overwrite=true", "--auto-file-renaming=false", "-d", d, "-o", name, url]
    if shutil.which("axel"):
        t["axel"] = ["axel", "-q", "-n", str(conns), "-o", out, url]
    if conns == 1:
        t["curl"] = ["curl", "-sS", "-o", out, url]
        if shutil.which("wget"):
            t["wget"] = ["wget", "-q", "-O", out, url]
    return t


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--cases", default="throttled,single,multi,skewed")
    ap.add_argument("--pickup", default=os.path.join(ROOT, ".build/release/pickup"))
    args = ap.parse_args()
    if not os.path.exists(args.pickup):
        raise SystemExit("build first: swift build -c release")
    base = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()
    work = tempfile.mkdtemp(prefix="pickup-bench-", dir=base)
    site, outdir = os.path.join(work, "site"), os.path.join(work, "out")
    os.makedirs(site), os.makedirs(outdir)
    sizes = {"256m.bin": 256 * MiB, "1g.bin": 1024 * MiB}
    digests = {}
    for name, size in sizes.items():
        data = os.urandom(size)
        digests[name] = hashlib.sha256(data).hexdigest()
        with open(os.path.join(site, name), "wb") as f:
            f.write(data)
        del data
    port = free_port()
    nginx = start_nginx(work, site, port)
    base_url = f"http://127.0.0.1:{port}"
    cases = {
        "throttled": ("per-connection limit 20 MiB/s, 256 MiB, 16 connections", "/throttled/256m.bin", 16,
                      256 / (16 * 20)),
        "single": ("unthrottled loopback, 1 GiB, 1 connection", "/1g.bin", 1, None),
        "multi": ("unthrottled loopback, 1 GiB, 16 connections", "/1g.bin", 16, None),
        # Ideal: the slow connection (2 MiB/s) and 15 fast ones (20 MiB/s) share the file.
        "skewed": ("one connection 10x slower (2 vs 20 MiB/s), 256 MiB, 16 connections", "/skewed/256m.bin", 16,
                   256 / (15 * 20 + 2)),
    }
    print(f"machine: {os.cpu_count()} cores, {time.strftime('%Y-%m-%d')}, outputs on {base}, {args.runs} runs, medians")
    try:
        for key in args.cases.split(","):
            title, path, conns, ideal = cases[key]
            name = os.path.basename(path)
            out = os.path.join(outdir, name)
            cmds = tools(args.pickup, conns, base_url + path, out)
            results = {t: [] for t in cmds}
            order = list(cmds)
            for i in range(args.runs):
                for tool in (order if i % 2 == 0 else list(reversed(order))):
                    for leftover in os.listdir(outdir):
                        os.remove(os.path.join(outdir, leftover))
                    wall, cpu, rss, code = run(cmds[tool])
                    ok = code == 0 and os.path.exists(out) and os.path.getsize(out) == sizes[name]
                    if ok and i == 0:
                        with open(out, "rb") as f:
                            ok = hashlib.file_digest(f, "sha256").hexdigest() == digests[name]
                    results[tool].append((wall, cpu, rss, ok))
            print(f"\n### {title}" + (f" (physical limit {ideal:.2f} s)" if ideal else ""))
            print("| tool | wall s | CPU s | peak RSS MiB | wall vs pickup | CPU vs pickup | ok |")
            print("| --- | --- | --- | --- | --- | --- | --- |")
            med = {t: [statistics.median(x[k] for x in r) for k in range(3)] for t, r in results.items()}
            pw, pc = med["pickup"][0], med["pickup"][1]
            for tool, (w, c, m) in med.items():
                okay = all(x[3] for x in results[tool])
                extra = f" ({w / ideal:.2f}x limit)" if ideal else ""
                print(f"| {tool} | {w:.2f}{extra} | {c:.2f} | {m:.0f} | {w / pw:.2f} | {c / pc if pc else 0:.2f} | {'yes' if okay else 'NO'} |")
            sys.stdout.flush()
    finally:
        nginx.kill()
        nginx.wait()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
