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
    let process: Process
    let kind: Kind

    /// `http://127.0.0.1:PORT` or `socks5://127.0.0.1:PORT`.
    public var url: String { (kind == .tinyproxy ? "http" : "socks5") + "://127.0.0.1:\(port)" }

    public init(_ kind: Kind) throws {
        guard let binary = Self.binary(kind) else { throw NSError(domain: "proxy not installed", code: 1) }
        self.kind = kind
        work = NSTemporaryDirectory() + "pickup-proxy-" + UUID().uuidString
        try FileManager.default.createDirectory(atPath: work, withIntermediateDirectories: true)
        port = try Nginx.freePort()
        process = Process()
        process.executableURL = URL(fileURLWithPath: binary)
        _ = FileManager.default.createFile(atPath: work + "/out.log", contents: nil)
        let out = FileHandle(forWritingAtPath: work + "/out.log")
        process.standardOutput = out
        process.standardError = out
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
                """
            try conf.write(toFile: work + "/proxy.conf", atomically: true, encoding: .utf8)
            process.arguments = ["-d", "-c", work + "/proxy.conf"]
        case .microsocks:
            process.arguments = ["-i", "127.0.0.1", "-p", "\(port)"]
        }
        try process.run()
        let deadline = Date().addingTimeInterval(10)
        while !Nginx.canConnect(port) {
            guard Date() < deadline, process.isRunning else { throw NSError(domain: "proxy did not start: \(log)", code: 2) }
            usleep(20_000)
        }
    }

    /// What the proxy logged so far.
    public var log: String {
        ((try? String(contentsOfFile: work + "/proxy.log", encoding: .utf8)) ?? "")
            + ((try? String(contentsOfFile: work + "/out.log", encoding: .utf8)) ?? "")
    }

    /// How many connections it made to `port` (its log lines for them).
    public func connections(to port: Int) -> Int {
        log.components(separatedBy: "\n").filter {
            $0.contains("CONNECT 127.0.0.1:\(port) ") || $0.contains("connected to 127.0.0.1:\(port)")
        }.count
    }

    public func stop() {
        if process.isRunning {
            kill(process.processIdentifier, SIGKILL)
            process.waitUntilExit()
        }
        try? FileManager.default.removeItem(atPath: work)
    }
}
