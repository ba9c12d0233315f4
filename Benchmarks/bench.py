#!/usr/bin/env python3
"""Pickup against aria2c, axel, curl and wget on the same work, from nginx on loopback.

Starts nginx, generates the files, runs every tool on every case several times in alternating
order and prints the median wall time, CPU time (user+sys) and peak RSS of each, with ratios, and
the TCP connections the servers accepted per run ("conns": nginx's own count from its stub_status,
the mirrors-even servers' own; none for squid and ftp).
Outputs go to the disk (a folder under .build/, the file system named in each table) and, as a
second column, to tmpfs (/dev/shm), where fsync costs nothing; `--fs disk` or `--fs tmpfs` runs one.
Every network case runs over https and then over plain http (`--scheme https,http`, a table each):
nginx also listens with TLS, with a self-signed certificate for 127.0.0.1 made at start, which
each tool is told to trust as users would (pickup `--ca-certificate`, curl `--cacert`, wget and
aria2c `--ca-certificate=`); axel has no such option and gets `-k` (no verification) over https.

    swift build -c release && python3 Benchmarks/bench.py            # all cases, 5 runs
    python3 Benchmarks/bench.py --runs 3 --cases single,throttled     # a subset
    python3 Benchmarks/bench.py --runs 1 --cases single,defaults --size-mib 64 --scheme https  # a quick look

Cases: throttled, single, multi, skewed (one file; single and multi of `--size-mib`, 1 GiB unless
told); defaults (the same file, every tool with its defaults as users type it: `pickup get URL -o
OUT`, `curl -o OUT URL`, `wget -O OUT URL`, `aria2c -d D -o N URL`, `axel -o OUT URL`, plus only
what trusts the certificate and keeps them quiet and overwriting); batch (400 files of 64 KiB, 16 at
a time, `pickup get -i` against `aria2c -i -j16` and `wget -i`); queue (10,000 queued downloads in
the DownloadManager: adding, listing, restoring; no network); daemon (API latency with 10,000
downloads); events (the same with 100 event-stream clients, half of which never read: latency and
peak memory); daemon and events fetch over plain http only (`pickup serve` has no option to trust a
certificate); limits (the rate `--limit-rate` achieves, from 1 KiB/s to 1 MiB/s; not in the default
set: 32 s per scheme); squid (1 GiB through Squid on loopback with Debian's default rules, one
connection: plain http in absolute form, so http only; against curl, wget and aria2c through the
same Squid; not in the default set); ftp (1 GiB from vsftpd, one connection) and ftp-limited
(256 MiB, 8 connections against a limit of 8 MiB/s per session): against curl, wget, aria2c and
axel; vsftpd must start as root; not in the default set. mirrors (three nginx servers with one
48 MiB file, each taking 2 connections per client at 4 MiB/s): against aria2c and axel given the
three URLs; not in the default set. mirrors-even (the same with three servers of this script's own,
`even_server`, that pace each connection evenly with a token bucket instead of nginx's bursts, so
no tool can beat the ideal of 2.0 s): not in the default set.
"""
import argparse, hashlib, http.client, json, os, random, shlex, shutil, signal, socket, ssl, statistics, subprocess, sys, \
    tempfile, threading, time

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


def make_certificate(work):
    """A self-signed certificate for 127.0.0.1 and its key, in `work`: (certificate, key)."""
    cert, key = os.path.join(work, "cert.pem"), os.path.join(work, "key.pem")
    subprocess.run(["/usr/bin/openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", cert,
                    "-days", "2", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    return cert, key


def start_nginx(work, site, port, status_port, tls=None, mirror_ports=(), h2_port=None):
    """nginx serving `site` on `port`, and with TLS on the same locations on `tls`'s port when `tls` is
    (port, certificate, key), and on `h2_port` with TLS offering HTTP/2 as well; its stub_status on
    `status_port`. `mirror_ports`: (plain, TLS or None)."""
    listen = lambda p, tp: f"listen 127.0.0.1:{p};" + (f" listen 127.0.0.1:{tp} ssl;" if tp else "")
    # Mirrors (the mirrors case): each its own server, 2 connections per client, 4 MiB/s each; a
    # third connection gets 503.
    mirrors = "".join(f"""
    limit_conn_zone $binary_remote_addr zone=mirror{i}:1m;
    server {{
        {listen(p, tp)}
        root {site};
        limit_conn mirror{i} 2; limit_conn_status 503; limit_rate 4m;
    }}""" for i, (p, tp) in enumerate(mirror_ports))
    certificate = f"ssl_certificate {tls[1]}; ssl_certificate_key {tls[2]};" if tls else ""
    conf = f"""
{'user root;' if os.geteuid() == 0 else ''}
daemon off; master_process off; worker_processes 1;
pid {work}/nginx.pid; error_log {work}/error.log warn;
events {{ worker_connections 4096; }}
http {{
    access_log off; sendfile on; tcp_nopush on; keepalive_requests 100000;
    client_body_temp_path {work}/body; proxy_temp_path {work}/proxy; fastcgi_temp_path {work}/fcgi;
    {certificate}
    # The connection that asks for the start of the file is ten times slower than the others.
    map $http_range $skew_rate {{ "~^bytes=0-" 2m; default 20m; }}
    server {{
        {listen(port, tls[0] if tls else None)}{f" listen 127.0.0.1:{h2_port} ssl http2;" if h2_port else ""}
        root {site};
        location /throttled/ {{ alias {site}/; limit_rate 20m; }}
        location /skewed/ {{ alias {site}/; limit_rate $skew_rate; }}
        location /slow/ {{ alias {site}/; limit_rate 128k; }}
    }}{mirrors}
    # The connections accepted, by every server above ("accepts"): the conns column.
    server {{
        listen 127.0.0.1:{status_port};
        location = /status {{ stub_status; }}
    }}
}}
"""
    path = os.path.join(work, "nginx.conf")
    with open(path, "w") as f:
        f.write(conf)
    proc = subprocess.Popen(["nginx", "-p", work, "-c", path, "-e", f"{work}/error.log"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return listening(proc, port, 10, lambda: "nginx did not start: " + open(f"{work}/error.log").read())


class NginxAccepts:
    """nginx's count of accepted connections (stub_status), less those of its own questions: the
    difference across a run is the connections that run opened. Exact, unlike a count of requests in
    an access log, which nginx writes for a connection cut by the client only once it notices."""

    def __init__(self, port):
        self.port, self.asked = port, 0

    def __call__(self):
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        c.request("GET", "/status")
        text = c.getresponse().read().decode()
        c.close()
        self.asked += 1
        return int(text.splitlines()[2].split()[0]) - self.asked


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


def counted(cmd, accepts=None, env=None):
    """`run`, and the connections the server accepted meanwhile (None without `accepts`)."""
    before = accepts() if accepts else None
    wall, cpu, rss, code = run(cmd, env)
    return wall, cpu, rss, code, (accepts() - before if accepts else None)


# axel (2.17, `axel --help`) has no option for a CA file, only -k/--insecure: over https it does the
# same TLS work but does not check the certificate.
AXEL_HTTPS = "axel over https: `-k` (it has no option for a CA file), so it does not verify the certificate"


def trust(tool, url, ca):
    """The flags with which `tool` trusts the certificate `ca` for `url`, as users would type them."""
    if not url.startswith("https:"):
        return []
    return {"pickup": ["--ca-certificate", ca], "curl": ["--cacert", ca], "wget": [f"--ca-certificate={ca}"],
            "aria2c": [f"--ca-certificate={ca}"], "axel": ["-k"]}[tool]


def tools(pickup, conns, url, out, baseline=None, proxy=None, ca=None):
    d, name = os.path.dirname(out), os.path.basename(out)
    via = ["--proxy", proxy] if proxy else []
    t = {"pickup": [pickup, "get", url, "-o", out, "-q", "--overwrite", "-x", str(conns)] + via + trust("pickup", url, ca)}
    if baseline:
        t["pickup-before"] = [baseline] + t["pickup"][1:]
    if shutil.which("aria2c"):
        t["aria2c"] = ["aria2c", "-q", f"-x{conns}", f"-s{conns}", "-k1M", "--file-allocation=none",
                       "--allow-overwrite=true", "--auto-file-renaming=false", "-d", d, "-o", name, url] \
            + ([f"--all-proxy={proxy}"] if proxy else []) + trust("aria2c", url, ca)
    if shutil.which("axel") and not proxy:
        t["axel"] = ["axel", "-q", "-n", str(conns), "-o", out, url] + trust("axel", url, ca)
    if conns == 1:
        t["curl"] = ["curl", "-sS", "-o", out, url] + (["-x", proxy] if proxy else []) + trust("curl", url, ca)
        if proxy:
            # What Pickup does on top: the bytes made durable before the file counts as done.
            t["curl + fsync"] = ["sh", "-c", f"curl -sS -o '{out}' -x '{proxy}' '{url}' && sync '{out}'"]
        if shutil.which("wget"):
            t["wget"] = ["wget", "-q", "-O", out, url] + (["-e", "use_proxy=yes", "-e", f"http_proxy={proxy}"] if proxy else []) \
                + trust("wget", url, ca)
    return t


def default_tools(pickup, url, out, baseline=None, ca=None):
    """Every tool with its defaults as users type it, plus only the flags that trust the certificate,
    keep it quiet and let it overwrite."""
    d, name = os.path.dirname(out), os.path.basename(out)
    t = {"pickup": [pickup, "get", url, "-o", out, "-q", "--overwrite"] + trust("pickup", url, ca)}
    if baseline:
        t["pickup-before"] = [baseline] + t["pickup"][1:]
    t["curl"] = ["curl", "-sS", "-o", out, url] + trust("curl", url, ca)
    # The same work as Pickup's: the bytes durable (fsynced) before the download counts as done.
    t["curl + fsync"] = ["sh", "-c", " ".join(shlex.quote(w) for w in t["curl"]) + f" && sync {shlex.quote(out)}"]
    if shutil.which("wget"):
        t["wget"] = ["wget", "-q", "-O", out, url] + trust("wget", url, ca)
    if shutil.which("aria2c"):
        t["aria2c"] = ["aria2c", "-q", "--allow-overwrite=true", "--auto-file-renaming=false", "-d", d, "-o", name, url] \
            + trust("aria2c", url, ca)
    if shutil.which("axel"):
        t["axel"] = ["axel", "-q", "-o", out, url] + trust("axel", url, ca)
    return t


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--cases", default="throttled,single,multi,skewed,defaults,batch,queue,daemon,events")
    ap.add_argument("--scheme", default="https,http",
                    help="over which schemes each network case runs, in this order (ftp and squid: their own); "
                         "h2: https from a port that offers HTTP/2 too")
    ap.add_argument("--size-mib", type=int, default=1024, help="the file of the single, multi, defaults, squid and ftp cases")
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
    args.products = os.path.dirname(os.path.abspath(args.pickup))
    # Pickup (and the baseline) run from fresh copies on the disk, as an installed binary does
    # (`install`, `cp`): how a binary's pages came into the page cache changes its peak RSS. The
    # same binary peaked 1.6 MiB higher as a copy than where the linker had written it, and a
    # baseline copied to /tmp 2-3 MiB higher than pickup in .build (2026-11-29): copies both.
    installed = os.path.join(args.disk_dir, "bin")
    os.makedirs(installed, exist_ok=True)
    for attr, name in (("pickup", "pickup"), ("baseline", "pickup-before")):
        if getattr(args, attr):
            copy = os.path.join(installed, name)
            if os.path.exists(copy):
                os.remove(copy)
            shutil.copy2(getattr(args, attr), copy)
            setattr(args, attr, copy)
    schemes = args.scheme.split(",")
    if not schemes or set(schemes) - {"http", "https", "h2"}:
        raise SystemExit(f"--scheme: https, http, h2 or several, not {args.scheme}")
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
        # Labelled by the file system found there; two places on one type keep both (neither is
        # dropped unused, nor left behind after the run).
        kind = fs_type(d)
        outdirs[kind if kind not in outdirs else f"{kind} ({fs})"] = d
    first = next(iter(outdirs.values()))  # the daemon and limits cases write there
    wanted = args.cases.split(",")
    # The file of the single, multi, defaults, squid and ftp cases.
    big, big_size = ("1g.bin", "1 GiB") if args.size_mib == 1024 else (f"{args.size_mib}m.bin", f"{args.size_mib} MiB")
    sizes = {}
    if {"daemon", "events"} & set(wanted):
        sizes["64m.bin"] = 64 * MiB
    if "limits" in wanted:
        for rate in LIMITS:
            sizes[f"limit-{rate}.bin"] = rate * LIMIT_SECONDS
    if {"mirrors", "mirrors-even"} & set(wanted):
        sizes["48m.bin"] = 48 * MiB
    if {"throttled", "skewed", "ftp-limited"} & set(wanted):
        sizes["256m.bin"] = 256 * MiB
    if {"single", "multi", "defaults", "squid", "ftp"} & set(wanted):
        sizes[big] = args.size_mib * MiB
    digests = {}
    for name, size in sizes.items():
        # Generated by a child process, so this script's own RSS (which children inherit as their
        # starting peak) stays small.
        path = os.path.join(site, name)
        subprocess.run(["head", "-c", str(size), "/dev/urandom"], stdout=open(path, "wb"), check=True)
        with open(path, "rb") as f:
            digests[name] = hashlib.file_digest(f, "sha256").hexdigest()
    https = bool({"https", "h2"} & set(schemes))
    cert, cert_key = make_certificate(work) if https else (None, None)
    port, status_port = free_port(), free_port()
    tls = (free_port(), cert, cert_key) if https else None
    mirror_ports = [(free_port(), free_port() if https else None) for _ in range(3)] if "mirrors" in wanted else []
    h2_port = free_port() if "h2" in schemes else None
    nginx = start_nginx(work, site, port, status_port, tls, mirror_ports, h2_port)
    accepts = NginxAccepts(status_port)
    base_url = f"http://127.0.0.1:{port}"
    # Each scheme's origin, in the order of --scheme (https first unless told).
    origins = {s: base_url if s == "http" else f"https://127.0.0.1:{h2_port if s == 'h2' else tls[0]}" for s in schemes}
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
        "single": (f"unthrottled loopback, {big_size}, 1 connection", f"/{big}", 1, None),
        "multi": (f"unthrottled loopback, {big_size}, 16 connections", f"/{big}", 16, None),
        "defaults": (f"every tool with its defaults (pickup get URL -o OUT, curl -o OUT URL, wget -O OUT URL, "
                     f"aria2c -d D -o N URL, axel -o OUT URL), unthrottled loopback, {big_size}", f"/{big}", None, None),
        "squid": ("through Squid (Debian's default rules) on loopback, plain http in absolute form, "
                  f"{big_size}, 1 connection", f"/{big}", 1, None),
        "ftp": (f"FTP from vsftpd on loopback, {big_size}, 1 connection", f"/{big}", 1, None),
        "ftp-limited": ("FTP from vsftpd, 8 MiB/s per session, 256 MiB, 8 connections", "/256m.bin", 8, 256 / (8 * 8)),
        # Ideal: the slow connection (2 MiB/s) and 15 fast ones (20 MiB/s) share the file.
        "skewed": ("one connection 10x slower (2 vs 20 MiB/s), 256 MiB, 16 connections", "/skewed/256m.bin", 16,
                   256 / (15 * 20 + 2)),
    }
    where = ", ".join(f"{fs} ({d})" for fs, d in outdirs.items())
    print(f"machine: {os.cpu_count()} cores, {time.strftime('%Y-%m-%d')}, outputs on {where}, {args.runs} runs, medians; "
          f"schemes {', '.join(schemes)}")
    try:
        for key in wanted:
            if key == "batch":
                batch_case(args, work, site, outdirs, origins, cert, accepts)
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
                limits_case(args, first, origins, cert)
                continue
            if key == "mirrors":
                mirrors_case(args, outdirs, mirror_ports, schemes, cert, accepts, digests["48m.bin"])
                continue
            if key == "mirrors-even":
                mirrors_even_case(args, work, site, outdirs, schemes, cert, cert_key, digests["48m.bin"])
                continue
            title, path, conns, ideal = cases[key]
            name = os.path.basename(path)
            if key in ("ftp", "ftp-limited"):
                # vsftpd: neither scheme, and no count of connections.
                runs = [(None, {"ftp": ftp_url, "ftp-limited": ftp_limited_url}[key], None)]
            elif key == "squid":
                # Debian's rules let CONNECT (https through the proxy) reach port 443 only; Squid's
                # connections to nginx are not the tool's.
                runs = [(None, base_url, None)]
                if "https" in schemes:
                    print("\n(squid over https skipped: Debian's default rules allow CONNECT to port 443 only)")
            else:
                runs = [(scheme, origin, accepts) for scheme, origin in origins.items()]
            for scheme, origin, counter in runs:
                results = {}
                for i in range(args.runs):
                    # Alternating tools and file systems, so that neither order nor drift favours one.
                    for fs, d in (outdirs.items() if i % 2 == 0 else reversed(list(outdirs.items()))):
                        out = os.path.join(d, name)
                        if key == "defaults":
                            cmds = default_tools(args.pickup, origin + path, out, args.baseline, ca=cert)
                        else:
                            cmds = tools(args.pickup, conns, origin + path, out, args.baseline,
                                         proxy=squid_url if key == "squid" else None, ca=cert)
                        if key == "ftp-limited":
                            # curl and wget have one connection only: 8x the ideal time, nothing to learn.
                            cmds.pop("curl", None)
                            cmds.pop("wget", None)
                        order = list(cmds)
                        for tool in (order if i % 2 == 0 else list(reversed(order))):
                            clear(d)
                            wall, cpu, rss, code, opened = counted(cmds[tool], counter)
                            ok = code == 0 and os.path.exists(out) and os.path.getsize(out) == sizes[name]
                            if ok and i == 0:
                                with open(out, "rb") as f:
                                    ok = hashlib.file_digest(f, "sha256").hexdigest() == digests[name]
                            results.setdefault(tool, {}).setdefault(fs, []).append((wall, cpu, rss, ok, opened))
                        clear(d)
                print_table(f"### {title}" + (f", over {scheme}" if scheme else "")
                            + (f" (physical limit {ideal:.2f} s)" if ideal else ""), results, ideal,
                            note=AXEL_HTTPS if scheme in ("https", "h2") and "axel" in results else None)
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


def mirror_runs(args, outdirs, urls, digest, ca, accepts):
    """Each tool given the three mirrors' `urls` and 6 connections, alternating; results by tool."""
    results = {}
    for i in range(args.runs):
        for fs, d in (outdirs.items() if i % 2 == 0 else reversed(list(outdirs.items()))):
            out = os.path.join(d, "48m.bin")
            cmds = {"pickup": [args.pickup, "get", *urls, "-o", out, "-q", "--overwrite", "-x", "6"] + trust("pickup", urls[0], ca)}
            if shutil.which("aria2c"):
                cmds["aria2c"] = ["aria2c", "-q", "-x2", "-s6", "-k1M", "--file-allocation=none", "--allow-overwrite=true",
                                  "--auto-file-renaming=false", "-d", d, "-o", "48m.bin"] + urls + trust("aria2c", urls[0], ca)
            if shutil.which("axel"):
                cmds["axel"] = ["axel", "-q", "-n", "6", "-o", out] + urls + trust("axel", urls[0], ca)
            order = list(cmds)
            for tool in (order if i % 2 == 0 else list(reversed(order))):
                clear(d)
                wall, cpu, rss, code, opened = counted(cmds[tool], accepts)
                ok = code == 0 and os.path.exists(out) and os.path.getsize(out) == 48 * MiB
                if ok and i == 0:
                    with open(out, "rb") as f:
                        ok = hashlib.file_digest(f, "sha256").hexdigest() == digest
                results.setdefault(tool, {}).setdefault(fs, []).append((wall, cpu, rss, ok, opened))
            clear(d)
    return results


def mirrors_case(args, outdirs, ports, schemes, ca, accepts, digest):
    """Three mirrors of a 48 MiB file, each taking 2 connections from us at 4 MiB/s (a third gets
    503): ideal 48 / (3 x 2 x 4) = 2.0 s. Each tool gets the three URLs and 6 connections."""
    for scheme in schemes:
        urls = [f"{scheme}://127.0.0.1:{p if scheme == 'http' else tp}/48m.bin" for p, tp in ports]
        results = mirror_runs(args, outdirs, urls, digest, ca, accepts)
        print_table(f"### three mirrors, 2 connections each at 4 MiB/s, 48 MiB, over {scheme} (physical limit 2.00 s)",
                    results, 2.0, note=AXEL_HTTPS if scheme in ("https", "h2") and "axel" in results else None)


def mirrors_even_case(args, work, site, outdirs, schemes, cert, key, digest):
    """The mirrors case with three servers that pace evenly (`even_server`, each in its own process):
    2 connections per client, 4 MiB/s each, no bursts to beat the ideal of 2.0 s with."""
    for scheme in schemes:
        ports = [free_port() for _ in range(3)]
        logs = [os.path.join(work, f"even-{p}.accepts") for p in ports]
        servers = []
        try:
            for p, log in zip(ports, logs):
                cmd = [sys.executable, os.path.abspath(__file__), "--even-server", str(p), site, log] \
                      + ([cert, key] if scheme == "https" else [])
                proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=open(log + ".err", "w"))
                servers.append(listening(proc, p, 10, lambda: "even_server did not start: " + open(log + ".err").read()))
                while not os.path.getsize(log):  # `listening`'s connection, counted before any run
                    time.sleep(0.01)
            # Each server appends a byte per connection it accepts.
            accepts = lambda: sum(os.path.getsize(x) for x in logs)
            urls = [f"{scheme}://127.0.0.1:{p}/48m.bin" for p in ports]
            results = mirror_runs(args, outdirs, urls, digest, cert, accepts)
        finally:
            for proc in servers:
                proc.kill()
                proc.wait()
        print_table(f"### three mirrors pacing evenly (token bucket), 2 connections each at 4 MiB/s, 48 MiB, over {scheme} "
                    "(physical limit 2.00 s)", results, 2.0,
                    note=AXEL_HTTPS if scheme in ("https", "h2") and "axel" in results else None)


EVEN_RATE = 4 * MiB  # bytes per second, per connection
EVEN_SLICE = 16 * 1024  # sent at a time: 256 slices a second at EVEN_RATE
EVEN_CONNECTIONS = 2  # per client address; past that, 503


def byte_range(header, size):
    """(first, last) of a single `bytes=` range of a file of `size` bytes; None if it is
    unsatisfiable (416); () if it is not one this server reads (answered whole, 200)."""
    unit, _, spec = header.partition("=")
    first, dash, last = spec.strip().partition("-")
    if unit.strip().lower() != "bytes" or "," in spec or not dash:
        return ()
    try:
        if not first.strip():  # the last `last` bytes
            n = int(last)
            return (max(0, size - n), size - 1) if n > 0 and size > 0 else None
        a = int(first)
        b = int(last) if last.strip() else None
    except ValueError:
        return ()
    if a < 0 or (b is not None and b < a):
        return ()
    return (a, size - 1 if b is None else min(b, size - 1)) if a < size else None


def even_server(port, site, accepts, cert=None, key=None):
    """A mirror of the files in `site` on `port` (TLS with `cert` and `key` if given), paced evenly: a
    token bucket per connection at EVEN_RATE, sending EVEN_SLICE at a time (the bucket holds two, so
    a late wake-up is made up for, never a burst); at most EVEN_CONNECTIONS per client, 503 past that;
    Range (206, 416), If-Range, ETag and Last-Modified. Appends a byte to `accepts` per connection."""
    # Imported here, in the server's own process: the script's RSS is every child's starting peak.
    import email.utils, http.server, socketserver, urllib.parse
    context = None
    if cert:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(cert, key)
    counter = open(accepts, "ab", buffering=0)
    active, lock = {}, threading.Lock()

    class Server(socketserver.ThreadingMixIn, socketserver.TCPServer):
        allow_reuse_address = daemon_threads = True
        request_queue_size = 128

        def get_request(self):
            sock, address = self.socket.accept()
            counter.write(b"\n")
            if context:  # the handshake in the connection's own thread
                sock = context.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
            return sock, address

        def handle_error(self, request, address):
            pass  # a client gone in the middle, a failed handshake

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def setup(self):
            self.request.settimeout(30)
            if context:
                self.request.do_handshake()
            super().setup()
            self.client = self.client_address[0]
            with lock:
                active[self.client] = active.get(self.client, 0) + 1
                self.over = active[self.client] > EVEN_CONNECTIONS
            self.tokens, self.last = 0.0, time.monotonic()

        def finish(self):
            with lock:
                active[self.client] -= 1
            try:
                super().finish()
            except OSError:
                pass

        def log_message(self, *args):
            pass

        def do_GET(self):
            self.answer(True)

        def do_HEAD(self):
            self.answer(False)

        def answer(self, body):
            if self.over:
                self.send_error(503)  # and Connection: close
                return
            try:
                fd = os.open(os.path.join(site, os.path.basename(urllib.parse.urlsplit(self.path).path)), os.O_RDONLY)
            except OSError:
                self.send_error(404)
                return
            try:
                st = os.fstat(fd)
                size = st.st_size
                etag = f'"{st.st_mtime_ns:x}-{size:x}"'
                modified = email.utils.formatdate(st.st_mtime, usegmt=True)
                first, last, status = 0, size - 1, 200
                asked, condition = self.headers.get("Range"), self.headers.get("If-Range")
                if asked and (condition is None or condition.strip() in (etag, modified)):
                    r = byte_range(asked, size)
                    if r is None:
                        self.send_response(416)
                        self.send_header("Content-Range", f"bytes */{size}")
                        self.send_header("Content-Length", "0")
                        self.end_headers()
                        return
                    if r:
                        (first, last), status = r, 206
                self.send_response(status)
                self.send_header("Content-Type", "application/octet-stream")
                self.send_header("Accept-Ranges", "bytes")
                self.send_header("ETag", etag)
                self.send_header("Last-Modified", modified)
                self.send_header("Content-Length", str(last + 1 - first))
                if status == 206:
                    self.send_header("Content-Range", f"bytes {first}-{last}/{size}")
                self.end_headers()
                if body:
                    self.pace(fd, first, last + 1)
            finally:
                os.close(fd)

        def pace(self, fd, offset, end):
            while offset < end:
                n = min(EVEN_SLICE, end - offset)
                now = time.monotonic()
                self.tokens = min(2 * EVEN_SLICE, self.tokens + (now - self.last) * EVEN_RATE)
                self.last = now
                if self.tokens < n:
                    time.sleep((n - self.tokens) / EVEN_RATE)
                    continue
                self.wfile.write(os.pread(fd, n, offset))
                self.tokens -= n
                offset += n

    with Server(("127.0.0.1", int(port)), Handler) as server:
        server.serve_forever()


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


def print_table(title, results, ideal=None, note=None):
    """Medians of (wall, cpu, rss, ok, conns) runs per tool and file system, as a Markdown table; the
    ratios to pickup are on the first file system; conns: the connections the server accepted per
    run, over all runs (median, and the range where runs differ; "-" where not counted)."""
    print(f"\n{title}")
    systems = list(next(iter(results.values())))
    head = "| tool | " + " | ".join(f"wall s {fs} | CPU s {fs}" for fs in systems)
    print(head + f" | peak RSS MiB | conns | wall vs pickup ({systems[0]}) | CPU vs pickup | ok |")
    print("| --- " * (6 + 2 * len(systems)) + "|")
    med = {t: {fs: [statistics.median(x[k] for x in r) for k in range(3)] for fs, r in per.items()}
           for t, per in results.items()}
    pw, pc = med["pickup"][systems[0]][0], med["pickup"][systems[0]][1]
    for tool, per in med.items():
        okay = all(x[3] for r in results[tool].values() for x in r)
        opened = [x[4] for r in results[tool].values() for x in r if x[4] is not None]
        conns = "-"
        if opened:
            m = statistics.median(opened)
            conns = f"{m:g}" + (f" ({min(opened)}-{max(opened)})" if min(opened) != max(opened) else "")
        cells = []
        for fs in systems:
            w, c, _ = per[fs]
            cells.append(f"{w:.2f}" + (f" ({w / ideal:.2f}x limit)" if ideal else "") + f" | {c:.2f}")
        w, c, m = per[systems[0]]
        print(f"| {tool} | {' | '.join(cells)} | {m:.0f} | {conns} | {w / pw:.2f} | {c / pc if pc else 0:.2f} | {'yes' if okay else 'NO'} |")
    if note:
        print(note)
    sys.stdout.flush()


def batch_case(args, work, site, outdirs, origins, ca, accepts, count=400, size=64 * 1024, jobs=16):
    """Many small files: what each download costs beyond its bytes."""
    os.makedirs(os.path.join(site, "batch"))
    digests = {}
    for i in range(count):
        data = os.urandom(size)
        with open(os.path.join(site, "batch", f"{i}.bin"), "wb") as f:
            f.write(data)
        digests[f"{i}.bin"] = hashlib.sha256(data).hexdigest()
    for scheme, origin in origins.items():
        listing = os.path.join(work, f"list-{scheme}.txt")
        with open(listing, "w") as f:
            f.write("".join(f"{origin}/batch/{i}.bin\n" for i in range(count)))
        state = os.path.join(work, "state")
        url = origin + "/"
        cmds = {"pickup": [args.pickup, "get", "-i", listing, "-d", "OUTDIR", "-j", str(jobs), "-q"] + trust("pickup", url, ca)}
        if args.baseline:
            cmds["pickup-before"] = [args.baseline] + cmds["pickup"][1:]
        if shutil.which("aria2c"):
            cmds["aria2c"] = ["aria2c", "-q", "-i", listing, f"-j{jobs}", "--file-allocation=none", "-d", "OUTDIR"] \
                + trust("aria2c", url, ca)
        if shutil.which("wget"):
            cmds["wget"] = ["wget", "-q", "-i", listing, "-P", "OUTDIR"] + trust("wget", url, ca)
        results = {}
        order = list(cmds)
        for i in range(args.runs):
            for fs, outdir in (outdirs.items() if i % 2 == 0 else reversed(list(outdirs.items()))):
                for tool in (order if i % 2 == 0 else list(reversed(order))):
                    clear(outdir)
                    shutil.rmtree(state, ignore_errors=True)  # a new batch every run, not a resumed one
                    env = dict(os.environ, PICKUP_STATE_DIR=state)
                    cmd = [outdir if x == "OUTDIR" else x for x in cmds[tool]]
                    wall, cpu, rss, code, opened = counted(cmd, accepts, env=env)
                    names = sorted(n for n in os.listdir(outdir) if not n.startswith("."))
                    ok = code == 0 and len(names) == count
                    if ok and i == 0:
                        for n in names:
                            with open(os.path.join(outdir, n), "rb") as f:
                                ok = ok and hashlib.sha256(f.read()).hexdigest() == digests[n]
                    results.setdefault(tool, {}).setdefault(fs, []).append((wall, cpu, rss, ok, opened))
                clear(outdir)
        print_table(f"### {count} files of {size // 1024} KiB, {jobs} at a time (wget: one at a time), over {scheme}", results)


def queue_case(args):
    bench = os.path.join(args.products, "pickup-queue-bench")
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


def limits_case(args, outdir, origins, ca):
    """`pickup get --limit-rate R` of a file of R x 8 bytes: the rate achieved against the limit."""
    for scheme, origin in origins.items():
        print(f"\n### speed limits: a file of {LIMIT_SECONDS} s at the limit, one run each, over {scheme}")
        print("| limit B/s | file | wall s | achieved B/s | achieved / limit |")
        print("|---:|---:|---:|---:|---:|")
        for rate in LIMITS:
            name = f"limit-{rate}.bin"
            out = os.path.join(outdir, name)
            url = f"{origin}/{name}"
            wall, _, _, code = run([args.pickup, "get", url, "-o", out, "-q", "--overwrite", "-x", "1",
                                    "--limit-rate", str(rate)] + trust("pickup", url, ca))
            size = rate * LIMIT_SECONDS
            ok = code == 0 and os.path.exists(out) and os.path.getsize(out) == size
            print(f"| {rate} | {size // 1024} KiB | {wall:.2f} | {size / wall:.0f} | {size / wall / rate:.3f}{'' if ok else ' (failed)'} |")
        sys.stdout.flush()


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
    if sys.argv[1:2] == ["--even-server"]:  # the mirrors-even case's servers, each in its own process
        even_server(*sys.argv[2:])
    else:
        main()
