import Foundation

/// An FTP server from Debian's packages on loopback: pyftpdlib (`python3-pyftpdlib`), run by a
/// script the test writes: anonymous and `alice`/`s3cret` logins over `root`, an optional rate
/// limit per data connection (bytes per second), MDTM and SIZE as pyftpdlib answers them.
public final class FTPServerProcess: @unchecked Sendable {
    /// The Python that has pyftpdlib (Debian's, not one earlier in PATH).
    public static var python: String? {
        let python = "/usr/bin/python3"
        guard FileManager.default.isExecutableFile(atPath: python) else { return nil }
        let p = Process()
        p.executableURL = URL(fileURLWithPath: python)
        p.arguments = ["-c", "import pyftpdlib"]
        p.standardOutput = FileHandle.nullDevice
        p.standardError = FileHandle.nullDevice
        guard (try? p.run()) != nil else { return nil }
        p.waitUntilExit()
        return p.terminationStatus == 0 ? python : nil
    }

    public let port: Int
    let work: String
    let process: Process

    /// `ftp://127.0.0.1:PORT`.
    public var baseURL: String { "ftp://127.0.0.1:\(port)" }
    public func url(_ path: String) -> String { baseURL + path }

    public init(root: String, bytesPerSecond: Int = 0) throws {
        guard let python = Self.python else { throw NSError(domain: "pyftpdlib not installed", code: 1) }
        work = NSTemporaryDirectory() + "pickup-ftp-" + UUID().uuidString
        try FileManager.default.createDirectory(atPath: work, withIntermediateDirectories: true)
        port = try Nginx.freePort()
        let script = """
            import sys, logging
            from pyftpdlib.authorizers import DummyAuthorizer
            from pyftpdlib.handlers import FTPHandler, ThrottledDTPHandler
            from pyftpdlib.servers import FTPServer
            root, port, rate = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
            logging.basicConfig(filename=sys.argv[4], level=logging.INFO)
            authorizer = DummyAuthorizer()
            authorizer.add_anonymous(root)
            authorizer.add_user("alice", "s3cret", root, perm="elr")
            class Handler(FTPHandler):
                log_cmds_list = ["RETR", "REST", "SIZE", "MDTM", "EPSV", "PASV", "USER", "PASS"]
            Handler.authorizer = authorizer
            if rate > 0:
                class Throttled(ThrottledDTPHandler):
                    write_limit = rate
                Handler.dtp_handler = Throttled
            server = FTPServer(("127.0.0.1", port), Handler)
            server.max_cons = 256
            server.serve_forever()
            """
        try script.write(toFile: work + "/server.py", atomically: true, encoding: .utf8)
        process = Process()
        process.executableURL = URL(fileURLWithPath: python)
        process.arguments = [work + "/server.py", root, "\(port)", "\(bytesPerSecond)", work + "/ftp.log"]
        process.standardOutput = FileHandle.nullDevice
        process.standardError = FileHandle.nullDevice
        try process.run()
        let deadline = Date().addingTimeInterval(20)
        while !Nginx.canConnect(port) {
            guard Date() < deadline, process.isRunning else { throw NSError(domain: "pyftpdlib did not start: \(log)", code: 2) }
            usleep(20_000)
        }
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

    public func stop() {
        if process.isRunning {
            kill(process.processIdentifier, SIGKILL)
            process.waitUntilExit()
        }
        try? FileManager.default.removeItem(atPath: work)
    }
}
