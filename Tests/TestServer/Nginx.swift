import Foundation

/// A real nginx on loopback serving a directory, for integration tests and benchmarks.
/// `limit_rate` applies under `/slow/`.
public final class Nginx: @unchecked Sendable {
    /// Where nginx is installed, if it is.
    public static var binary: String? {
        ["/usr/sbin/nginx", "/usr/local/sbin/nginx", "/opt/homebrew/bin/nginx", "/usr/local/bin/nginx"]
            .first { FileManager.default.isExecutableFile(atPath: $0) }
    }

    /// The directory it serves.
    public let root: String
    /// The port.
    public let port: Int
    let work: String
    let process: Child

    /// `http://127.0.0.1:PORT`.
    public var baseURL: String { (tls ? "https" : "http") + "://127.0.0.1:\(port)" }
    let tls: Bool

    /// Starts nginx serving `root`, or throws when nginx is missing or does not come up.
    /// `locations` is added to the server block as it is (extra `location` blocks); `$WORK` in it is
    /// nginx's own work directory, where `files` are written first (name to contents).
    /// `http2`: offered by ALPN on the TLS port.
    public init(root: String, limitRate: String = "2m", locations: String = "", files: [String: String] = [:],
                tls: (certificate: String, key: String)? = nil, http2: Bool = false) async throws {
        guard let binary = Nginx.binary else { throw NSError(domain: "nginx not installed", code: 1) }
        self.root = root
        self.tls = tls != nil
        work = NSTemporaryDirectory() + "pickup-nginx-" + UUID().uuidString
        try FileManager.default.createDirectory(atPath: work, withIntermediateDirectories: true)
        port = try Nginx.freePort()
        for (name, contents) in files { try contents.write(toFile: work + "/" + name, atomically: true, encoding: .utf8) }
        let user = getuid() == 0 ? "user root;" : ""
        let conf = """
            \(user)
            daemon off;
            master_process off;
            worker_processes 1;
            pid \(work)/nginx.pid;
            error_log \(work)/error.log warn;
            events { worker_connections 1024; }
            http {
                log_format codes '$status $body_bytes_sent $connection $server_protocol';
                access_log \(work)/access.log codes;
                client_body_temp_path \(work)/body;
                proxy_temp_path \(work)/proxy;
                fastcgi_temp_path \(work)/fastcgi;
                sendfile on;
                tcp_nopush on;
                server {
                    listen 127.0.0.1:\(port)\(tls == nil ? "" : " ssl")\(http2 ? " http2" : "");
                    \(tls.map { "ssl_certificate \($0.certificate); ssl_certificate_key \($0.key);" } ?? "")
                    root \(root);
                    location /slow/ { alias \(root)/; limit_rate \(limitRate); }
                    \(locations.replacingOccurrences(of: "$WORK", with: work))
                }
            }
            """
        try conf.write(toFile: work + "/nginx.conf", atomically: true, encoding: .utf8)
        process = try await LocalServer.launch(binary, ["-p", work, "-c", work + "/nginx.conf", "-e", work + "/error.log"], work: work,
                                               port: port, seconds: 10, name: "nginx", logs: [work + "/error.log"], output: false)
    }

    /// Status codes nginx logged, in order.
    public var loggedStatuses: [Int] {
        let log = (try? String(contentsOfFile: work + "/access.log", encoding: .utf8)) ?? ""
        return log.split(separator: "\n").compactMap { Int($0.split(separator: " ").first ?? "") }
    }

    /// The connection (nginx's serial number) and protocol of each logged request, in order.
    public var loggedConnections: [(connection: Int, protocol: String)] {
        let log = (try? String(contentsOfFile: work + "/access.log", encoding: .utf8)) ?? ""
        return log.split(separator: "\n").compactMap { line in
            let f = line.split(separator: " ")
            guard f.count >= 4, let c = Int(f[2]) else { return nil }
            return (c, String(f[3]))
        }
    }

    /// Stops nginx (SIGKILL to its process group) and removes its folder; swift-subprocess reaps it.
    public func stop() { LocalServer.stop(process, work: work) }

    /// Released (also by a test that threw before ``stop()``): stopped.
    deinit { stop() }

    /// A loopback port nothing listens on and no server of this run had (``Ports``): for a
    /// server program to take, or for a test that needs a port where nothing answers.
    ///
    /// Taken outside the kernel's ephemeral range (`ip_local_port_range`; below it, else above), where no connection's
    /// local end and no bind to port 0 lands: a port from that range, free when this looked, was
    /// at times taken by one of the suite's many outgoing connections before the server program
    /// bound it (tinyproxy "could not create listening sockets", pyftpdlib "address already in use").
    /// Where the range leaves none (`1024 65535`), one the kernel offers for port 0, as before.
    public static func freePort() throws -> Int {
        let ephemeral = ephemeralRange()
        // Below the range, else above it; each window built only when it holds a port.
        var windows: [Range<Int>] = []
        let below = max(1024, ephemeral.lowerBound - 16384)
        if below < ephemeral.lowerBound { windows.append(below..<ephemeral.lowerBound) }
        let above = min(65536, ephemeral.upperBound + 1 + 16384)
        if ephemeral.upperBound + 1 < above { windows.append((ephemeral.upperBound + 1)..<above) }
        for window in windows {
            for _ in 0..<min(500, 4 * window.count) {
                let port = Int.random(in: window)
                if Ports.claim(port) && canBind(port) { return port }
            }
        }
        return try kernelsChoice()
    }

    /// A port the kernel offers for port 0 and no server of this run had.
    static func kernelsChoice() throws -> Int {
        var held: [Int32] = []
        defer { for fd in held { close(fd) } }
        for _ in 0..<100 {
            var port = 0
            let bound = withLoopbackSocket(port: 0) { fd, address, length in
                guard bind(fd, address, length) == 0 else { return false }
                var named = sockaddr_in(), size = socklen_t(MemoryLayout<sockaddr_in>.size)
                guard withUnsafeMutablePointer(to: &named, {
                    $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(fd, $0, &size) == 0 }
                }) else { return false }
                port = Int(UInt16(bigEndian: named.sin_port))
                // Kept bound until a new port is found, so that the kernel cannot offer it again.
                let kept = dup(fd)
                if kept >= 0 { held.append(kept) }
                return true
            }
            guard bound else { break }
            if Ports.claim(port) { return port }
        }
        throw NSError(domain: "no free port", code: 3)
    }

    /// The kernel's range of ports for connections' local ends (`32768...60999` if unread).
    static func ephemeralRange() -> ClosedRange<Int> {
        let text = (try? String(contentsOfFile: "/proc/sys/net/ipv4/ip_local_port_range", encoding: .utf8)) ?? ""
        let numbers = text.split(whereSeparator: { $0 == " " || $0 == "\t" || $0 == "\n" }).compactMap { Int($0) }
        guard numbers.count == 2, 1 <= numbers[0], numbers[0] <= numbers[1], numbers[1] <= 65535 else { return 32768...60999 }
        return numbers[0]...numbers[1]
    }

    /// Whether 127.0.0.1:`port` can be bound now (without `SO_REUSEADDR`: a port some socket still
    /// holds, in TIME_WAIT too, is not free).
    static func canBind(_ port: Int) -> Bool {
        withLoopbackSocket(port: port) { fd, address, length in bind(fd, address, length) == 0 }
    }

    public static func canConnect(_ port: Int) -> Bool {
        withLoopbackSocket(port: port) { fd, address, length in connect(fd, address, length) == 0 }
    }

    /// `body` on a new TCP socket and the address 127.0.0.1:`port` (false when no socket can be
    /// made); the socket is closed after.
    static func withLoopbackSocket(port: Int, _ body: (Int32, UnsafePointer<sockaddr>, socklen_t) -> Bool) -> Bool {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        guard fd >= 0 else { return false }
        defer { close(fd) }
        var addr = sockaddr_in()
        addr.sin_family = sa_family_t(AF_INET)
        addr.sin_addr.s_addr = inet_addr("127.0.0.1")
        addr.sin_port = UInt16(port).bigEndian
        return withUnsafePointer(to: &addr) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { body(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
        }
    }
}
