import Foundation

/// An FTP server from Debian's packages on loopback: pyftpdlib (`python3-pyftpdlib`), run by a
/// script the test writes: anonymous and `alice`/`s3cret` logins over `root`, an optional rate
/// limit per data connection (bytes per second), MDTM and SIZE as pyftpdlib answers them.
public final class FTPServerProcess: @unchecked Sendable {
    /// The Python that has pyftpdlib (Debian's, not one earlier in PATH).
    public static var python: String? {
        let python = "/usr/bin/python3"
        // Looked for, not imported: this is asked while tests are listed, where no child process
        // can be awaited (Debian's python3-pyftpdlib installs it there).
        let module = ["/usr/lib/python3/dist-packages/pyftpdlib/__init__.py", "/usr/local/lib/python3/dist-packages/pyftpdlib/__init__.py"]
        guard FileManager.default.isExecutableFile(atPath: python), module.contains(where: { FileManager.default.fileExists(atPath: $0) }) else { return nil }
        return python
    }

    public let port: Int
    let work: String
    let process: Child

    /// `ftp://127.0.0.1:PORT`.
    public var baseURL: String { "ftp://127.0.0.1:\(port)" }
    public func url(_ path: String) -> String { baseURL + path }

    /// What the server does wrong, on purpose.
    public struct Faults: Sendable {
        /// The first `drops` transfers are cut (the data connection closed, then `426`) after this
        /// many bytes.
        public var dropAfter: Int? = nil
        public var drops = 1
        /// `REST` is answered `502 Command not implemented`.
        public var refuseREST = false
        /// Past this many sessions at once from one address, `421 Too many connections`.
        public var maxSessions: Int? = nil
        /// Seconds before each reply on the control connection (the whole server waits).
        public var replyDelay = 0.0
        public init(dropAfter: Int? = nil, drops: Int = 1, refuseREST: Bool = false, maxSessions: Int? = nil, replyDelay: Double = 0) {
            self.dropAfter = dropAfter
            self.drops = drops
            self.refuseREST = refuseREST
            self.maxSessions = maxSessions
            self.replyDelay = replyDelay
        }
        var arguments: [String] {
            ["\(dropAfter ?? -1)", "\(drops)", refuseREST ? "1" : "0", "\(maxSessions ?? 0)", "\(replyDelay)"]
        }
    }

    public init(root: String, bytesPerSecond: Int = 0, faults: Faults = Faults()) async throws {
        guard let python = Self.python else { throw NSError(domain: "pyftpdlib not installed", code: 1) }
        work = NSTemporaryDirectory() + "pickup-ftp-" + UUID().uuidString
        try FileManager.default.createDirectory(atPath: work, withIntermediateDirectories: true)
        port = try Nginx.freePort()
        let script = """
            import sys, time, logging
            from pyftpdlib.authorizers import DummyAuthorizer
            from pyftpdlib.handlers import FTPHandler, DTPHandler, ThrottledDTPHandler
            from pyftpdlib.servers import FTPServer
            root, port, rate = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
            logging.basicConfig(filename=sys.argv[4], level=logging.INFO)
            drop_after, drops, refuse_rest, max_sessions, delay = int(sys.argv[5]), [int(sys.argv[6])], sys.argv[7] == "1", int(sys.argv[8]), float(sys.argv[9])
            authorizer = DummyAuthorizer()
            authorizer.add_anonymous(root)
            authorizer.add_user("alice", "s3cret", root, perm="elr")
            class Handler(FTPHandler):
                log_cmds_list = ["RETR", "REST", "SIZE", "MDTM", "EPSV", "PASV", "USER", "PASS"]
                def respond(self, resp, logfun=logging.debug):
                    if delay > 0:
                        time.sleep(delay)
                    super().respond(resp, logfun)
                def ftp_REST(self, line):
                    if refuse_rest:
                        self.respond("502 Command not implemented.")
                        return
                    super().ftp_REST(line)
            Handler.authorizer = authorizer
            base = ThrottledDTPHandler if rate > 0 else DTPHandler
            class Data(base):
                write_limit = rate
                def send(self, data):
                    if drop_after >= 0 and drops[0] > 0 and not self.receive:
                        room = drop_after - self.tot_bytes_sent
                        if room <= len(data):
                            if room > 0:
                                super().send(data[:room])
                            drops[0] -= 1
                            self._resp = ("426 Transfer aborted; connection dropped.", logging.debug)
                            self.close()
                            return 0
                    return super().send(data)
            Handler.dtp_handler = Data
            if drop_after >= 0:
                Handler.use_sendfile = False
            server = FTPServer(("127.0.0.1", port), Handler)
            server.max_cons = 256
            if max_sessions > 0:
                server.max_cons_per_ip = max_sessions
            server.serve_forever()
            """
        try script.write(toFile: work + "/server.py", atomically: true, encoding: .utf8)
        process = try await LocalServer.launch(python, [work + "/server.py", root, "\(port)", "\(bytesPerSecond)", work + "/ftp.log"] + faults.arguments,
                                         work: work, port: port, seconds: 20, name: "pyftpdlib", logs: [work + "/ftp.log"])
    }

    /// What it logged (one line per command of note: `RETR /f.bin completed=1 bytes=...`).
    public var log: String { (try? String(contentsOfFile: work + "/ftp.log", encoding: .utf8)) ?? "" }

    /// How many transfers of `path` it started (its log names the file by its full path: `RETR
    /// /tmp/.../f.bin 125`).
    public func retrievals(_ path: String) -> Int {
        log.components(separatedBy: "\n").filter {
            $0.contains("] RETR ") && ($0.hasSuffix(path + " 125") || $0.hasSuffix(path + " 150"))
        }.count
    }

    /// Kills it (SIGKILL to its process group) and removes its folder; swift-subprocess reaps it.
    public func stop() { LocalServer.stop(process, work: work) }
    /// Released (also by a test that threw before ``stop()``): killed.
    deinit { LocalServer.stop(process, work: work) }
}

/// vsftpd from Debian's package on loopback: anonymous, read-only, over `root`, with explicit TLS
/// (a certificate the test makes) and optionally its `require_ssl_reuse`; a rate per session.
/// It must start as root (it chroots anonymous sessions).
public final class VsftpdProcess: @unchecked Sendable {
    public static var binary: String? {
        getuid() == 0 && FileManager.default.isExecutableFile(atPath: "/usr/sbin/vsftpd") ? "/usr/sbin/vsftpd" : nil
    }

    public let port: Int
    let work: String
    let process: Child

    public func url(_ path: String, secure: Bool = false) -> String { (secure ? "ftps" : "ftp") + "://127.0.0.1:\(port)" + path }

    public init(root: String, certificate: (String, String)? = nil, requireSSLReuse: Bool = false, bytesPerSecond: Int = 0) async throws {
        guard let binary = Self.binary else { throw NSError(domain: "vsftpd not installed or not root", code: 1) }
        work = NSTemporaryDirectory() + "pickup-vsftpd-" + UUID().uuidString
        try FileManager.default.createDirectory(atPath: work + "/empty", withIntermediateDirectories: true)
        chmod(work, 0o755)
        chmod(work + "/empty", 0o755)
        // The anonymous user reads the files; the root of its chroot must not be writable by it.
        chmod(root, 0o755)
        port = try Nginx.freePort()
        var conf = [
            "listen=YES", "listen_ipv6=NO", "listen_address=127.0.0.1", "listen_port=\(port)", "background=NO",
            "anonymous_enable=YES", "anon_root=\(root)", "no_anon_password=YES", "local_enable=NO", "write_enable=NO",
            "pasv_enable=YES", "seccomp_sandbox=NO", "secure_chroot_dir=\(work)/empty", "ftp_username=ftp",
            "xferlog_enable=YES", "vsftpd_log_file=\(work)/vsftpd.log", "dual_log_enable=YES", "xferlog_file=\(work)/xfer.log",
            "log_ftp_protocol=YES", "max_clients=64", "max_per_ip=64",
        ]
        if bytesPerSecond > 0 { conf.append("anon_max_rate=\(bytesPerSecond)") }
        if let (cert, key) = certificate {
            conf += ["ssl_enable=YES", "allow_anon_ssl=YES", "force_anon_data_ssl=NO", "force_anon_logins_ssl=NO",
                     "rsa_cert_file=\(cert)", "rsa_private_key_file=\(key)", "require_ssl_reuse=\(requireSSLReuse ? "YES" : "NO")",
                     "ssl_ciphers=HIGH"]
        }
        try conf.joined(separator: "\n").appending("\n").write(toFile: work + "/vsftpd.conf", atomically: true, encoding: .utf8)
        process = try await LocalServer.launch(binary, [work + "/vsftpd.conf"], work: work, port: port, seconds: 20, name: "vsftpd",
                                         logs: [work + "/vsftpd.log"])
    }

    public var log: String {
        ((try? String(contentsOfFile: work + "/vsftpd.log", encoding: .utf8)) ?? "")
            + ((try? String(contentsOfFile: work + "/out.log", encoding: .utf8)) ?? "")
    }

    /// Kills it (SIGKILL to its process group) and removes its folder; swift-subprocess reaps it.
    public func stop() { LocalServer.stop(process, work: work) }
    /// Released (also by a test that threw before ``stop()``): killed.
    deinit { LocalServer.stop(process, work: work) }
}
