#!/usr/bin/env python3
"""Pickup against aria2c, axel, curl and wget on the same work, from nginx on loopback.

Starts nginx, generates the files, runs every tool on every case several times in alternating
order and prints the median wall time, CPU time (user+sys) and peak RSS of each, with ratios.
Outputs go to the disk (a folder under .build/, the file system named in each table) and, as a
second column, to tmpfs (/dev/shm), where fsync costs nothing; `--fs disk` or `--fs tmpfs` runs one.

    swift build -c release && python3 Benchmarks/bench.py            # all cases, 5 runs
    python3 Benchmarks/bench.py --runs 3 --cases single,throttled     # a subset

Cases: throttled, single, multi, skewed (one file); batch (400 files of 64 KiB, 16 at a time,
`pickup get -i` against `aria2c -i -j16` and `wget -i`); queue (10,000 queued downloads in the
DownloadManager: adding, listing, restoring; no network); daemon (API latency with 10,000 downloads);
events (the same with 100 event-stream clients, half of which never read: latency and peak memory);
limits (the rate `--limit-rate` achieves, from 1 KiB/s to 1 MiB/s; not in the default set: 32 s);
squid (1 GiB through Squid on loopback with Debian's default rules, one connection: plain http in
absolute form; against curl, wget and aria2c through the same Squid; not in the default set);
ftp (1 GiB from vsftpd, one connection) and ftp-limited (256 MiB, 8 connections against a limit of
8 MiB/s per session): against curl, wget, aria2c and axel; vsftpd must start as root; not in the
default set. mirrors (three nginx servers with one 48 MiB file, each taking 2 connections per client
at 4 MiB/s): against aria2c and axel given the three URLs; not in the default set.
"""
import argparse, hashlib, http.client, json, os, random, shutil, signal, socket, statistics, subprocess, sys, tempfile, \
    threading, time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MiB = 1024 * 1024


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def listening(proc, port, seconds, why):
    """Returns `proc` once something accepts connections on `port`, within `seconds`; else stops it
    and exits with `why()`."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.1).close()
            return proc
        except OSError:
            time.sleep(0.05)
    proc.kill()
    proc.wait(timeout=10)
    raise SystemExit(why())


def start_nginx(work, site, port, mirror_ports=()):
    # Mirrors (the mirrors case): each its own server, 2 connections per client, 4 MiB/s each; a
    # third connection gets 503.
    mirrors = "".join(f"""
    limit_conn_zone $binary_remote_addr zone=mirror{i}:1m;
    server {{
        listen 127.0.0.1:{p};
        root {site};
        limit_conn mirror{i} 2; limit_conn_status 503; limit_rate 4m;
    }}""" for i, p in enumerate(mirror_ports))
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
        location /slow/ {{ alias {site}/; limit_rate 128k; }}
    }}{mirrors}
}}
"""
    path = os.path.join(work, "nginx.conf")
    with open(path, "w") as f:
        f.write(conf)
    proc = subprocess.Popen(["nginx", "-p", work, "-c", path, "-e", f"{work}/error.log"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return listening(proc, port, 10, lambda: "nginx did not start: " + open(f"{work}/error.log").read())


def start_squid(work, port):
    """Squid with Debian's default access rules (its /etc/squid/squid.conf), no cache, on `port`."""
    squid = shutil.which("squid") or "/usr/sbin/squid"
    if not os.path.exists(squid):
        raise SystemExit("squid is not installed (apt-get install squid)")
    d = os.path.join(work, "squid")
    os.makedirs(d)
    os.chmod(work, 0o711)  # started as root, it runs as the proxy user: it must reach its folder
    os.chmod(d, 0o777)
    keep = [line.strip() for line in open("/etc/squid/squid.conf")
            if line.strip() and not line.strip().startswith(("#", "http_port", "coredump_dir", "include"))]
    keep += [f"http_port 127.0.0.1:{port}", f"pid_filename {d}/squid.pid", f"access_log stdio:{d}/access.log",
             f"cache_log {d}/cache.log", "cache_store_log none", "cache deny all", f"coredump_dir {d}",
             "logfile_rotate 0", "shutdown_lifetime 0 seconds", "visible_hostname pickup-bench"]
    conf = os.path.join(d, "squid.conf")
    with open(conf, "w") as f:
        f.write("\n".join(keep) + "\n")
    proc = subprocess.Popen([squid, "-N", "-f", conf], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return listening(proc, port, 30, lambda: "squid did not start: " + open(f"{d}/cache.log").read()[-2000:])


def start_vsftpd(work, site, port, rate=0):
    """vsftpd (Debian's package, started as root: it chroots anonymous sessions) serving `site`."""
    d = os.path.join(work, f"vsftpd-{port}")
    os.makedirs(os.path.join(d, "empty"))
    for p in (work, site, d, os.path.join(d, "empty")):
        os.chmod(p, 0o755)
    for name in os.listdir(site):
        if os.path.isfile(os.path.join(site, name)):
            os.chmod(os.path.join(site, name), 0o644)
    conf = os.path.join(d, "vsftpd.conf")
    lines = ["listen=YES", "listen_ipv6=NO", "listen_address=127.0.0.1", f"listen_port={port}", "background=NO",
             "anonymous_enable=YES", f"anon_root={site}", "no_anon_password=YES", "local_enable=NO", "write_enable=NO",
             "pasv_enable=YES", "seccomp_sandbox=NO", f"secure_chroot_dir={d}/empty", "ftp_username=ftp",
             "max_clients=256", "max_per_ip=256"] + ([f"anon_max_rate={rate}"] if rate else [])
    with open(conf, "w") as f:
        f.write("\n".join(lines) + "\n")
    proc = subprocess.Popen(["/usr/sbin/vsftpd", conf], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return listening(proc, port, 10, lambda: "vsftpd did not start (it must run as root)")


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


def tools(pickup, conns, url, out, baseline=None, proxy=None):
    d, name = os.path.dirname(out), os.path.basename(out)
    via = ["--proxy", proxy] if proxy else []
    t = {"pickup": [pickup, "get", url, "-o", out, "-q", "--overwrite", "-x", str(conns)] + via}
    if baseline:
        t["pickup-before"] = [baseline] + t["pickup"][1:]
    if shutil.which("aria2c"):
        t["aria2c"] = ["aria2c", "-q", f"-x{conns}", f"-s{conns}", "-k1M", "--file-allocation=none",
                       "--allow-overwrite=true", "--auto-file-renaming=false", "-d", d, "-o", name, url] \
            + ([f"--all-proxy={proxy}"] if proxy else [])
    if shutil.which("axel") and not proxy:
        t["axel"] = ["axel", "-q", "-n", str(conns), "-o", out, url]
    if conns == 1:
        t["curl"] = ["curl", "-sS", "-o", out, url] + (["-x", proxy] if proxy else [])
        if proxy:
            # What Pickup does on top: the bytes made durable before the file counts as done.
            t["curl + fsync"] = ["sh", "-c", f"curl -sS -o '{out}' -x '{proxy}' '{url}' && sync '{out}'"]
        if shutil.which("wget"):
            t["wget"] = ["wget", "-q", "-O", out, url] + (["-e", "use_proxy=yes", "-e", f"http_proxy={proxy}"] if proxy else [])
    return t


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--cases", default="throttled,single,multi,skewed,batch,queue,daemon,events")
    ap.add_argument("--pickup", default=os.path.join(ROOT, ".build/release/pickup"))
    ap.add_argument("--daemon-downloads", type=int, default=10_000, help="downloads in the daemon and events cases")
    ap.add_argument("--event-clients", default="50,50", help="events case: clients reading, clients never reading")
    ap.add_argument("--resume-all", action="store_true",
                    help="events case: pause and resume every download once the clients follow (a change per download, twice)")
    ap.add_argument("--baseline", help="another pickup binary to run beside it (before and after a change)")
    ap.add_argument("--fs", default="disk,tmpfs", help="where outputs go: disk (under .build/), tmpfs (/dev/shm), or both")
    ap.add_argument("--disk-dir", default=os.path.join(ROOT, ".build", "bench-out"), help="the folder on the disk")
    args = ap.parse_args()
    if not os.path.exists(args.pickup):
        raise SystemExit("build first: swift build -c release")
    base = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()
    work = tempfile.mkdtemp(prefix="pickup-bench-", dir=base)
    site = os.path.join(work, "site")
    os.makedirs(site)
    # Where each run's outputs go: the first is the one the ratios and the README use.
    outdirs = {}
    for fs in args.fs.split(","):
        if fs == "disk":
            os.makedirs(args.disk_dir, exist_ok=True)
            d = tempfile.mkdtemp(prefix="out-", dir=args.disk_dir)
        elif fs == "tmpfs":
            d = tempfile.mkdtemp(prefix="out-", dir=base)
        else:
            raise SystemExit(f"--fs: disk or tmpfs, not {fs}")
        outdirs[fs_type(d)] = d
    first = next(iter(outdirs.values()))  # the daemon and limits cases write there
    wanted = args.cases.split(",")
    sizes = {}
    if {"daemon", "events"} & set(wanted):
        sizes["64m.bin"] = 64 * MiB
    if "limits" in wanted:
        for rate in LIMITS:
            sizes[f"limit-{rate}.bin"] = rate * LIMIT_SECONDS
    if "mirrors" in wanted:
        sizes["48m.bin"] = 48 * MiB
    if {"throttled", "skewed", "ftp-limited"} & set(wanted):
        sizes["256m.bin"] = 256 * MiB
    if {"single", "multi", "squid", "ftp"} & set(wanted):
        sizes["1g.bin"] = 1024 * MiB
    digests = {}
    for name, size in sizes.items():
        # Generated by a child process, so this script's own RSS (which children inherit as their
        # starting peak) stays small.
        path = os.path.join(site, name)
        subprocess.run(["head", "-c", str(size), "/dev/urandom"], stdout=open(path, "wb"), check=True)
        with open(path, "rb") as f:
            digests[name] = hashlib.file_digest(f, "sha256").hexdigest()
    port = free_port()
    mirror_ports = [free_port() for _ in range(3)] if "mirrors" in wanted else []
    nginx = start_nginx(work, site, port, mirror_ports)
    base_url = f"http://127.0.0.1:{port}"
    ftps = []
    ftp_url = ftp_limited_url = None
    if "ftp" in wanted:
        port2 = free_port()
        ftps.append(start_vsftpd(work, site, port2))
        ftp_url = f"ftp://127.0.0.1:{port2}"
    if "ftp-limited" in wanted:
        port3 = free_port()
        ftps.append(start_vsftpd(work, site, port3, rate=8 * MiB))
        ftp_limited_url = f"ftp://127.0.0.1:{port3}"
    squid = None
    if "squid" in wanted:
        squid_url = f"http://127.0.0.1:{free_port()}"
        squid = start_squid(work, int(squid_url.rsplit(":", 1)[1]))
    cases = {
        "throttled": ("per-connection limit 20 MiB/s, 256 MiB, 16 connections", "/throttled/256m.bin", 16,
                      256 / (16 * 20)),
        "single": ("unthrottled loopback, 1 GiB, 1 connection", "/1g.bin", 1, None),
        "multi": ("unthrottled loopback, 1 GiB, 16 connections", "/1g.bin", 16, None),
        "squid": ("through Squid (Debian's default rules) on loopback, plain http in absolute form, 1 GiB, 1 connection",
                  "/1g.bin", 1, None),
        "ftp": ("FTP from vsftpd on loopback, 1 GiB, 1 connection", "/1g.bin", 1, None),
        "ftp-limited": ("FTP from vsftpd, 8 MiB/s per session, 256 MiB, 8 connections", "/256m.bin", 8, 256 / (8 * 8)),
        # Ideal: the slow connection (2 MiB/s) and 15 fast ones (20 MiB/s) share the file.
        "skewed": ("one connection 10x slower (2 vs 20 MiB/s), 256 MiB, 16 connections", "/skewed/256m.bin", 16,
                   256 / (15 * 20 + 2)),
    }
    where = ", ".join(f"{fs} ({d})" for fs, d in outdirs.items())
    print(f"machine: {os.cpu_count()} cores, {time.strftime('%Y-%m-%d')}, outputs on {where}, {args.runs} runs, medians")
    try:
        for key in wanted:
            if key == "batch":
                batch_case(args, work, site, outdirs, base_url)
                continue
            if key == "queue":
                queue_case(args)
                continue
            if key == "daemon":
                daemon_case(args, work, first, base_url, args.daemon_downloads)
                continue
            if key == "events":
                readers, stalled = (int(x) for x in args.event_clients.split(","))
                events_case(args, work, first, base_url, args.daemon_downloads, readers, stalled)
                continue
            if key == "limits":
                limits_case(args, first, base_url)
                continue
            if key == "mirrors":
                mirrors_case(args, outdirs, mirror_ports, digests["48m.bin"])
                continue
            title, path, conns, ideal = cases[key]
            name = os.path.basename(path)
            results = {}
            for i in range(args.runs):
                # Alternating tools and file systems, so that neither order nor drift favours one.
                for fs, d in (outdirs.items() if i % 2 == 0 else reversed(list(outdirs.items()))):
                    out = os.path.join(d, name)
                    origin = {"ftp": ftp_url, "ftp-limited": ftp_limited_url}.get(key, base_url)
                    cmds = tools(args.pickup, conns, origin + path, out, args.baseline,
                                 proxy=squid_url if key == "squid" else None)
                    if key == "ftp-limited":
                        # curl and wget have one connection only: 8x the ideal time, nothing to learn.
                        cmds.pop("curl", None)
                        cmds.pop("wget", None)
                    order = list(cmds)
                    for tool in (order if i % 2 == 0 else list(reversed(order))):
                        clear(d)
                        wall, cpu, rss, code = run(cmds[tool])
                        ok = code == 0 and os.path.exists(out) and os.path.getsize(out) == sizes[name]
                        if ok and i == 0:
                            with open(out, "rb") as f:
                                ok = hashlib.file_digest(f, "sha256").hexdigest() == digests[name]
                        results.setdefault(tool, {}).setdefault(fs, []).append((wall, cpu, rss, ok))
                    clear(d)
            print_table(f"### {title}" + (f" (physical limit {ideal:.2f} s)" if ideal else ""), results, ideal)
    finally:
        nginx.kill()
        nginx.wait()
        if squid:
            squid.kill()
            squid.wait()
        for p in ftps:
            p.kill()
            p.wait()
        shutil.rmtree(work, ignore_errors=True)
        for d in outdirs.values():
            shutil.rmtree(d, ignore_errors=True)


def mirrors_case(args, outdirs, ports, digest):
    """Three mirrors of a 48 MiB file, each taking 2 connections from us at 4 MiB/s (a third gets
    503): ideal 48 / (3 x 2 x 4) = 2.0 s. Each tool gets the three URLs and 6 connections."""
    urls = [f"http://127.0.0.1:{p}/48m.bin" for p in ports]
    results = {}
    for i in range(args.runs):
        for fs, d in (outdirs.items() if i % 2 == 0 else reversed(list(outdirs.items()))):
            out = os.path.join(d, "48m.bin")
            cmds = {"pickup": [args.pickup, "get", *urls, "-o", out, "-q", "--overwrite", "-x", "6"]}
            if shutil.which("aria2c"):
                cmds["aria2c"] = ["aria2c", "-q", "-x2", "-s6", "-k1M", "--file-allocation=none", "--allow-overwrite=true",
                                  "--auto-file-renaming=false", "-d", d, "-o", "48m.bin"] + urls
            if shutil.which("axel"):
                cmds["axel"] = ["axel", "-q", "-n", "6", "-o", out] + urls
            order = list(cmds)
            for tool in (order if i % 2 == 0 else list(reversed(order))):
                clear(d)
                wall, cpu, rss, code = run(cmds[tool])
                ok = code == 0 and os.path.exists(out) and os.path.getsize(out) == 48 * MiB
                if ok and i == 0:
                    with open(out, "rb") as f:
                        ok = hashlib.file_digest(f, "sha256").hexdigest() == digest
                results.setdefault(tool, {}).setdefault(fs, []).append((wall, cpu, rss, ok))
            clear(d)
    print_table("### three mirrors, 2 connections each at 4 MiB/s, 48 MiB (physical limit 2.00 s)", results, 2.0)


def clear(d):
    for leftover in os.listdir(d):
        path = os.path.join(d, leftover)
        if os.path.isdir(path):
            shutil.rmtree(path)
        else:
            os.remove(path)


def fs_type(path):
    """The type of the file system `path` is on (from /proc/mounts; 'disk' where there is none)."""
    path, best, kind = os.path.realpath(path), "", "disk"
    try:
        for line in open("/proc/mounts"):
            fields = line.split()
            mount = fields[1].replace("\\040", " ")
            if (path == mount or path.startswith(mount.rstrip("/") + "/")) and len(mount) >= len(best):
                best, kind = mount, fields[2]
    except OSError:
        pass
    return kind


def print_table(title, results, ideal=None):
    """Medians of (wall, cpu, rss, ok) runs per tool and file system, as a Markdown table; the
    ratios to pickup are on the first file system."""
    print(f"\n{title}")
    systems = list(next(iter(results.values())))
    head = "| tool | " + " | ".join(f"wall s {fs} | CPU s {fs}" for fs in systems)
    print(head + f" | peak RSS MiB | wall vs pickup ({systems[0]}) | CPU vs pickup | ok |")
    print("| --- " * (5 + 2 * len(systems)) + "|")
    med = {t: {fs: [statistics.median(x[k] for x in r) for k in range(3)] for fs, r in per.items()}
           for t, per in results.items()}
    pw, pc = med["pickup"][systems[0]][0], med["pickup"][systems[0]][1]
    for tool, per in med.items():
        okay = all(x[3] for r in results[tool].values() for x in r)
        cells = []
        for fs in systems:
            w, c, _ = per[fs]
            cells.append(f"{w:.2f}" + (f" ({w / ideal:.2f}x limit)" if ideal else "") + f" | {c:.2f}")
        w, c, m = per[systems[0]]
        print(f"| {tool} | {' | '.join(cells)} | {m:.0f} | {w / pw:.2f} | {c / pc if pc else 0:.2f} | {'yes' if okay else 'NO'} |")
    sys.stdout.flush()


def batch_case(args, work, site, outdirs, base_url, count=400, size=64 * 1024, jobs=16):
    """Many small files: what each download costs beyond its bytes."""
    os.makedirs(os.path.join(site, "batch"))
    digests = {}
    for i in range(count):
        data = os.urandom(size)
        with open(os.path.join(site, "batch", f"{i}.bin"), "wb") as f:
            f.write(data)
        digests[f"{i}.bin"] = hashlib.sha256(data).hexdigest()
    listing = os.path.join(work, "list.txt")
    with open(listing, "w") as f:
        f.write("".join(f"{base_url}/batch/{i}.bin\n" for i in range(count)))
    state = os.path.join(work, "state")
    cmds = {"pickup": [args.pickup, "get", "-i", listing, "-d", "OUTDIR", "-j", str(jobs), "-q"]}
    if args.baseline:
        cmds["pickup-before"] = [args.baseline] + cmds["pickup"][1:]
    if shutil.which("aria2c"):
        cmds["aria2c"] = ["aria2c", "-q", "-i", listing, f"-j{jobs}", "--file-allocation=none", "-d", "OUTDIR"]
    if shutil.which("wget"):
        cmds["wget"] = ["wget", "-q", "-i", listing, "-P", "OUTDIR"]
    results = {}
    order = list(cmds)
    for i in range(args.runs):
        for fs, outdir in (outdirs.items() if i % 2 == 0 else reversed(list(outdirs.items()))):
            for tool in (order if i % 2 == 0 else list(reversed(order))):
                clear(outdir)
                shutil.rmtree(state, ignore_errors=True)  # a new batch every run, not a resumed one
                env = dict(os.environ, PICKUP_STATE_DIR=state)
                cmd = [outdir if x == "OUTDIR" else x for x in cmds[tool]]
                wall, cpu, rss, code = run(cmd, env=env)
                names = sorted(n for n in os.listdir(outdir) if not n.startswith("."))
                ok = code == 0 and len(names) == count
                if ok and i == 0:
                    for n in names:
                        with open(os.path.join(outdir, n), "rb") as f:
                            ok = ok and hashlib.sha256(f.read()).hexdigest() == digests[n]
                results.setdefault(tool, {}).setdefault(fs, []).append((wall, cpu, rss, ok))
            clear(outdir)
    print_table(f"### {count} files of {size // 1024} KiB, {jobs} at a time (wget: one at a time)", results)


def queue_case(args):
    bench = os.path.join(os.path.dirname(args.pickup), "pickup-queue-bench")
    if not os.path.exists(bench):
        print("\n(queue case skipped: build pickup-queue-bench with swift build -c release)")
        return
    print("\n### 10,000 queued downloads in the DownloadManager (SQLite in a temporary directory)")
    sys.stdout.flush()
    subprocess.run([bench, "10000"], check=True)


def percentile(samples, p):
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))]


LIMITS = [1024, 10 * 1024, 100 * 1024, 1024 * 1024]
LIMIT_SECONDS = 8


def limits_case(args, first, base_url):
    """`pickup get --limit-rate R` of a file of R x 8 bytes: the rate achieved against the limit."""
    print(f"\n### speed limits: a file of {LIMIT_SECONDS} s at the limit, one run each")
    print("| limit B/s | file | wall s | achieved B/s | achieved / limit |")
    print("|---:|---:|---:|---:|---:|")
    for rate in LIMITS:
        name = f"limit-{rate}.bin"
        out = os.path.join(outdir, name)
        wall, _, _, code = run([args.pickup, "get", f"{base_url}/{name}", "-o", out, "-q", "--overwrite", "-x", "1",
                                "--limit-rate", str(rate)])
        size = rate * LIMIT_SECONDS
        ok = code == 0 and os.path.getsize(out) == size
        print(f"| {rate} | {size // 1024} KiB | {wall:.2f} | {size / wall:.0f} | {size / wall / rate:.3f}{'' if ok else ' (failed)'} |")


class DaemonUnderTest:
    """`pickup serve` in a child process, with `count` downloads added over the API (16 transferring
    from nginx at 128 KiB/s each), and a client for timed API calls."""

    def __init__(self, args, work, outdir, base_url, count, running=16):
        self.state = os.path.join(work, f"daemon-state-{time.monotonic_ns()}")
        self.proc = subprocess.Popen([args.pickup, "serve", "--listen", "127.0.0.1:0", "-d", outdir, "--state", self.state,
                                      "-j", str(running), "-x", "1"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        address = os.path.join(self.state, "daemon.json")
        for _ in range(400):
            if os.path.exists(address):
                break
            time.sleep(0.05)
        url = json.load(open(address))["url"]
        self.token = open(os.path.join(self.state, "token")).read().strip()
        host, port = url[len("http://"):].rsplit(":", 1)
        self.host, self.port = host, int(port)
        self.conn = http.client.HTTPConnection(host, self.port)
        self.headers = {"Authorization": f"Bearer {self.token}", "Content-Type": "application/json"}
        self.added = [self.call("POST", "/downloads",
                                json.dumps({"url": f"{base_url}/slow/64m.bin?n={i}", "name": f"d/{i}.bin"}))[0]
                      for i in range(count)]
        for _ in range(400):
            if len(json.loads(self.call("GET", "/downloads?state=running")[1])) == running:
                break
            time.sleep(0.05)

    def call(self, method, path, body=None):
        start = time.perf_counter()
        self.conn.request(method, "/api/v1" + path, body=body, headers=self.headers)
        response = self.conn.getresponse()
        data = response.read()
        elapsed = time.perf_counter() - start
        if response.status >= 300:
            raise SystemExit(f"{method} {path}: {response.status} {data[:200]}")
        return elapsed, data

    def follow(self, counter):
        """A client on the event stream that reads everything, in a thread; counts events."""
        def run():
            c = http.client.HTTPConnection(self.host, self.port)
            c.request("GET", "/api/v1/events", headers=self.headers)
            r = c.getresponse()
            while True:
                line = r.fp.readline()
                if not line:
                    return
                if line.startswith(b"event:"):
                    counter["n"] += 1
                    if line.startswith(b"event: snapshot"):
                        counter["snapshots"] = counter.get("snapshots", 0) + 1
        threading.Thread(target=run, daemon=True).start()

    def stalled_client(self):
        """A client that asks for the event stream and never reads (a small receive buffer)."""
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.connect((self.host, self.port))
        s.sendall(f"GET /api/v1/events HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n"
                  f"Authorization: Bearer {self.token}\r\n\r\n".encode())
        return s

    def peak_rss(self):
        for line in open(f"/proc/{self.proc.pid}/status"):
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
        return 0

    def stop(self):
        start = time.monotonic()
        self.proc.send_signal(signal.SIGTERM)
        code = self.proc.wait(timeout=60)
        return time.monotonic() - start, code

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def latency_table(rows):
    print("| request | n | p50 ms | p99 ms | max ms |")
    print("|---|---:|---:|---:|---:|")
    for title, samples in rows:
        print(f"| {title} | {len(samples)} | {percentile(samples, 50) * 1000:.2f} | {percentile(samples, 99) * 1000:.2f} "
              f"| {max(samples) * 1000:.2f} |")


def daemon_case(args, work, outdir, base_url, count=10_000):
    """`pickup serve` with 10,000 queued downloads, 16 of them transferring (nginx at 128 KiB/s each)
    and a client following the event stream: API latency, measured from a second process."""
    d = DaemonUnderTest(args, work, outdir, base_url, count)
    try:
        events = {"n": 0}
        d.follow(events)
        one = [d.call("GET", f"/downloads/{random.randint(1, count)}")[0] for _ in range(3000)]
        page = [d.call("GET", "/downloads?limit=100")[0] for _ in range(300)]
        run_list = [d.call("GET", "/downloads?state=running")[0] for _ in range(300)]
        full = []
        for _ in range(60):
            elapsed, data = d.call("GET", "/downloads")
            full.append(elapsed)
        size = len(data)
        listed = len(json.loads(data))
        states = json.loads(d.call("GET", "/downloads?state=running")[1])
        rss = d.peak_rss()
        stopped, code = d.stop()
    finally:
        d.kill()
    print(f"\n### daemon: {count:,} queued downloads, {len(states)} transferring, a client on the event stream "
          f"({events['n']} events seen while measuring)")
    latency_table([("POST /downloads (adding the 10,000)", d.added), ("GET /downloads/{id}", one),
                   ("GET /downloads?limit=100", page), ("GET /downloads?state=running", run_list),
                   (f"GET /downloads (all {listed:,}, {size / MiB:.1f} MiB of JSON)", full)])
    print(f"daemon peak RSS {rss:.0f} MiB; SIGTERM to exit {stopped:.2f} s (exit {code})")


def events_case(args, work, outdir, base_url, count=10_000, readers=50, stalled=50):
    """`pickup serve` with 10,000 downloads and 100 event-stream clients, half of which never read:
    API latency and the daemon's peak memory."""
    d = DaemonUnderTest(args, work, outdir, base_url, count)
    sockets = []
    try:
        base_rss = d.peak_rss()
        events = {"n": 0}
        for _ in range(readers):
            d.follow(events)
        sockets = [d.stalled_client() for _ in range(stalled)]
        if args.resume_all:
            d.call("POST", "/pause-all")
            d.call("POST", "/resume-all")
        one = []
        # Measured while the snapshots go out, and on until every reader has had its own.
        deadline = time.monotonic() + 120
        while len(one) < 3000 or (events.get("snapshots", 0) < readers and time.monotonic() < deadline):
            one.append(d.call("GET", f"/downloads/{random.randint(1, count)}")[0])
        rss = d.peak_rss()
        stopped, code = d.stop()
    finally:
        for s in sockets:
            s.close()
        d.kill()
    print(f"\n### daemon events: {count:,} downloads, {readers} event clients reading and {stalled} never reading"
          + (", pause-all then resume-all" if args.resume_all else "")
          + f" ({events.get('snapshots', 0)} snapshots and {events['n']} events read while measuring)")
    latency_table([("GET /downloads/{id}", one)])
    print(f"daemon peak RSS {rss:.0f} MiB ({base_rss:.0f} MiB before the clients); SIGTERM to exit {stopped:.2f} s (exit {code})")


if __name__ == "__main__":
    main()
