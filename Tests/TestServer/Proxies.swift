import Foundation

/// A real proxy from Debian's packages on loopback: tinyproxy (HTTP, CONNECT) or microsocks
/// (SOCKS5), with its log, for tests that must see requests go through it.
public final class ProxyProcess: @unchecked Sendable {
    public enum Kind: Sendable { case tinyproxy, microsocks }

    /// Where the program is installed, if it is.
    public static func binary(_ kind: Kind) -> String? {
        let name = kind == .tinyproxy ? "tinyproxy" : "microsocks"
        return ["/usr/bin/", "/usr/sbin/", "/usr/local/bin/"].map { $0 + name }.first { FileManager.default.isExecutableFile(atPath: $0) }
    }

    public let port: Int
    let work: String
    let process: Child
    let kind: Kind

    /// `http://127.0.0.1:PORT` or `socks5://127.0.0.1:PORT`.
    public var url: String { (kind == .tinyproxy ? "http" : "socks5") + "://127.0.0.1:\(port)" }

    /// `extraConfig`: lines added to tinyproxy's configuration (`BasicAuth user password`, say).
    /// `bindOutgoing`: the local address microsocks connects from (`-b`: another loopback
    /// address, so that a server sees which connections came through the proxy).
    public init(_ kind: Kind, extraConfig: String = "", bindOutgoing: String? = nil) async throws {
        guard let binary = Self.binary(kind) else { throw NSError(domain: "proxy not installed", code: 1) }
        self.kind = kind
        work = NSTemporaryDirectory() + "pickup-proxy-" + UUID().uuidString
        try FileManager.default.createDirectory(atPath: work, withIntermediateDirectories: true)
        port = try Nginx.freePort()
        let arguments: [String]
        switch kind {
        case .tinyproxy:
            let conf = """
                Port \(port)
                Listen 127.0.0.1
                Timeout 60
                LogFile "\(work)/proxy.log"
                LogLevel Connect
                MaxClients 200
                Allow 127.0.0.1
                PidFile "\(work)/proxy.pid"
                \(extraConfig)
                """
            try conf.write(toFile: work + "/proxy.conf", atomically: true, encoding: .utf8)
            arguments = ["-d", "-c", work + "/proxy.conf"]
        case .microsocks:
            arguments = ["-i", "127.0.0.1", "-p", "\(port)"] + (bindOutgoing.map { ["-b", $0] } ?? [])
        }
        process = try await LocalServer.launch(binary, arguments, work: work, port: port, seconds: 10, name: "\(kind)",
                                         logs: [work + "/proxy.log"])
    }

    /// What the proxy logged so far.
    public var log: String {
        ((try? String(contentsOfFile: work + "/proxy.log", encoding: .utf8)) ?? "")
            + ((try? String(contentsOfFile: work + "/out.log", encoding: .utf8)) ?? "")
    }

    /// How many requests it forwarded to `port`: tunnels (CONNECT), requests in absolute form
    /// (tinyproxy's log lines for them), SOCKS connections (microsocks').
    public func connections(to port: Int) -> Int {
        log.components(separatedBy: "\n").filter {
            $0.contains("CONNECT 127.0.0.1:\(port) ") || $0.contains("connected to 127.0.0.1:\(port)")
                || $0.contains("GET http://127.0.0.1:\(port)/")
        }.count
    }

    /// Requests it received in absolute form for `port` (`GET http://127.0.0.1:PORT/...`).
    public func absoluteFormRequests(to port: Int) -> Int {
        log.components(separatedBy: "\n").filter { $0.contains("Request (file descriptor") && $0.contains("GET http://127.0.0.1:\(port)/") }.count
    }

    /// Kills it (SIGKILL to its process group) and removes its folder; swift-subprocess reaps it.
    public func stop() { LocalServer.stop(process, work: work) }
    /// Released (also by a test that threw before ``stop()``): killed.
    deinit { LocalServer.stop(process, work: work) }
}

/// Squid from Debian's package on loopback, with Debian's default access rules (its
/// /etc/squid/squid.conf, comments dropped): plain http in absolute form to ports 80 and 1025-65535,
/// CONNECT to port 443 only. What a test changes: the port it listens on, where its logs and pid
/// file go, no disk cache, and `extraSSLPorts` (the port of a TLS server the test starts, which
/// cannot be 443 without root) added to the `SSL_ports` rule.
public final class SquidProcess: @unchecked Sendable {
    public static var binary: String? {
        ["/usr/sbin/squid", "/usr/bin/squid"].first { FileManager.default.isExecutableFile(atPath: $0) }
    }

    public let port: Int
    let work: String
    let process: Child

    /// `http://127.0.0.1:PORT`.
    public var url: String { "http://127.0.0.1:\(port)" }

    public init(extraSSLPorts: [Int] = [], extraConfig: String = "") async throws {
        guard let binary = Self.binary else { throw NSError(domain: "squid not installed", code: 1) }
        work = NSTemporaryDirectory() + "pickup-squid-" + UUID().uuidString
        try FileManager.default.createDirectory(atPath: work, withIntermediateDirectories: true)
        // Squid started as root runs as the `proxy` user: it must be able to write its logs here.
        chmod(work, 0o777)
        port = try Nginx.freePort()
        let debian = (try? String(contentsOfFile: "/etc/squid/squid.conf", encoding: .utf8)) ?? ""
        var lines: [String] = []
        for raw in debian.components(separatedBy: "\n") {
            let line = raw.trimmingCharacters(in: .whitespaces)
            if line.isEmpty || line.hasPrefix("#") || line.hasPrefix("http_port") || line.hasPrefix("coredump_dir")
                || line.hasPrefix("include") { continue }
            lines.append(line)
            if line.hasPrefix("acl SSL_ports") && extraSSLPorts.count > 0 {
                lines.append("acl SSL_ports port " + extraSSLPorts.map(String.init).joined(separator: " "))
                lines.append("acl Safe_ports port " + extraSSLPorts.map(String.init).joined(separator: " "))
            }
        }
        if lines.isEmpty { throw NSError(domain: "no /etc/squid/squid.conf", code: 3) }
        lines += [
            "http_port 127.0.0.1:\(port)",
            "pid_filename \(work)/squid.pid",
            "access_log stdio:\(work)/access.log",
            "cache_log \(work)/cache.log",
            "cache_store_log none",
            "cache deny all",
            "coredump_dir \(work)",
            "logfile_rotate 0",
            "shutdown_lifetime 0 seconds",
            "visible_hostname pickup-test",
            extraConfig,
        ]
        try lines.joined(separator: "\n").write(toFile: work + "/squid.conf", atomically: true, encoding: .utf8)
        process = try await LocalServer.launch(binary, ["-N", "-f", work + "/squid.conf"], work: work, port: port, seconds: 30,
                                         name: "squid", logs: [work + "/cache.log"])
    }

    /// Its access log so far (one line per request: `TCP_MISS/206 ... GET http://...`).
    public var accessLog: String { (try? String(contentsOfFile: work + "/access.log", encoding: .utf8)) ?? "" }

    /// Everything it logged.
    public var log: String {
        accessLog + ((try? String(contentsOfFile: work + "/cache.log", encoding: .utf8)) ?? "")
            + ((try? String(contentsOfFile: work + "/out.log", encoding: .utf8)) ?? "")
    }

    /// Kills it (SIGKILL to its process group) and removes its folder; swift-subprocess reaps it.
    public func stop() { LocalServer.stop(process, work: work) }
    /// Released (also by a test that threw before ``stop()``): killed.
    deinit { LocalServer.stop(process, work: work) }
}
