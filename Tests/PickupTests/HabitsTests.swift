import Foundation
import SystemPackage
import Testing
import TestServer

@testable import Pickup

/// Runs openssl with `args` in `dir` (its output discarded); returns its exit status.
@discardableResult
func openssl(_ args: [String], in dir: TempDir) async throws -> Int32 {
    try await Child.run("/usr/bin/openssl", args, workingDirectory: dir.path.string, output: .null, errors: .null).status.code
}

/// A self-signed certificate and its key in `dir` for `name` (a DNS name, or an IP address),
/// valid for two days from now, or (`expired`) for one day in 2020.
func makeCertificate(in dir: TempDir, for name: String, expired: Bool = false) async throws -> (certificate: String, key: String) {
    let san = name.first?.isNumber == true ? "IP:\(name)" : "DNS:\(name)"
    if !expired {
        try await openssl(["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "key.pem", "-out", "cert.pem", "-days", "2",
                     "-subj", "/CN=\(name)", "-addext", "subjectAltName=\(san)"], in: dir)
    } else {
        // `openssl req` takes no dates in the past: `openssl ca` signs the request itself with them.
        dir.write("index.txt", [])
        dir.write("ca.conf", Array("""
            [ca]
            default_ca = d
            [d]
            database = index.txt
            new_certs_dir = .
            serial = serial
            default_md = sha256
            policy = p
            copy_extensions = copy
            [p]
            commonName = supplied

            """.utf8))
        try await openssl(["req", "-new", "-newkey", "rsa:2048", "-nodes", "-keyout", "key.pem", "-out", "req.pem", "-subj", "/CN=\(name)",
                     "-addext", "subjectAltName=\(san)"], in: dir)
        try await openssl(["ca", "-batch", "-config", "ca.conf", "-selfsign", "-keyfile", "key.pem", "-in", "req.pem", "-out", "cert.pem",
                     "-startdate", "20200101000000Z", "-enddate", "20200102000000Z", "-create_serial", "-notext"], in: dir)
    }
    guard FileManager.default.fileExists(atPath: dir.file("cert.pem").string) else { throw NSError(domain: "openssl made no certificate", code: 1) }
    return (dir.file("cert.pem").string, dir.file("key.pem").string)
}

/// The habits of curl, wget and aria2c users, each against the real binary: `-o -`, `-i -`,
/// `-c`, unknown options named, 404 as "not found", failures that name the host, TLS failures in
/// words, a port in use in words, a rerun said once, a mirror that is another file said plainly,
/// and `-Z`.
@Suite(.serialized, .timeLimit(.minutes(5))) struct HabitsTests {
    /// Runs `pickup` off Swift's cooperative pool.
    func pickup(_ args: [String], state: TempDir, input: [UInt8]? = nil) async throws -> (status: Int32, out: Data, err: String) {
        try await CLI.captureBytes(args, state: state.path, input: input)
    }

    func lines(_ text: String, containing part: String) -> Int {
        text.split(separator: "\n").filter { $0.contains(part) }.count
    }

    /// `-o -`: the file's bytes, and nothing else, on standard output, through a dropped
    /// connection (taken up with If-Range); "not resumable" said once on standard error.
    @Test func dashOStreamsTheFileToStandardOutput() async throws {
        let server = try await TestServer.start()
        defer { Task { await server.stop() } }
        let body = Resource.bytes(count: 3_000_000, seed: 35)
        server.set("/s.bin", Resource(body: body, faults: [.dropAfter(1_000_000)]))
        let state = TempDir()
        let r = try await pickup(["get", server.url("/s.bin"), "-o", "-"], state: state)
        #expect(r.status == 0, "\(r.err)")
        #expect(Array(r.out) == body, "standard output is the file, byte for byte (\(r.out.count) bytes)")
        #expect(lines(r.err, containing: "not resumable") == 1, "\(r.err)")
        let resumed = server.requests("/s.bin").last
        #expect(server.requests("/s.bin").count == 2 && resumed?.headers["if-range"] == "\"v1\"", "\(server.requests("/s.bin"))")
        #expect(!FileManager.default.fileExists(atPath: CLI.workingDirectory.appendingPathComponent("-").path), "no file named -")
        // Quiet: the bytes and nothing on standard error; a wrong checksum is said after the bytes (exit 5).
        server.set("/q.bin", Resource(body: body))
        let quiet = try await pickup(["get", server.url("/q.bin"), "-o", "-", "-q"], state: state)
        #expect(quiet.status == 0 && Array(quiet.out) == body && quiet.err.isEmpty, "\(quiet.err)")
        let wrong = try await pickup(["get", server.url("/q.bin"), "-o", "-", "-q", "--checksum", "sha-256=" + String(repeating: "0", count: 64)],
                                     state: state)
        #expect(wrong.status == 5, "\(wrong.err)")
        // Options that need a file are refused with it.
        let json = try await pickup(["get", server.url("/q.bin"), "-o", "-", "--json"], state: state)
        #expect(json.status == 2 && json.out.isEmpty && json.err.contains("--json"), "\(json.err)")
    }

    /// `-o -` without a strong validator: a dropped connection cannot be taken up (the rest could
    /// be another version's), so the stream fails in words after the bytes it had, never spliced.
    @Test func dashOWithoutAStrongValidatorDoesNotResume() async throws {
        let server = try await TestServer.start()
        defer { Task { await server.stop() } }
        let body = Resource.bytes(count: 3_000_000, seed: 36)
        server.set("/n.bin", Resource(body: body, etag: nil, faults: [.dropAfter(1_000_000)]))
        let r = try await pickup(["get", server.url("/n.bin"), "-o", "-"], state: TempDir())
        #expect(r.status == 3, "\(r.err)")
        #expect(r.err.contains("no strong validator"), "\(r.err)")
        #expect(r.out.count < body.count && body.starts(with: r.out), "standard output holds the first bytes only")
        #expect(server.requests("/n.bin").count == 1)
    }

    /// `-o -` into a pipe nobody reads: the transfer waits without holding the transport's threads,
    /// so an interrupt still ends it (exit 130) instead of a write stuck on an event loop.
    @Test func dashOIntoAPipeNobodyReadsStillStopsOnInterrupt() async throws {
        let server = try await TestServer.start()
        defer { Task { await server.stop() } }
        server.set("/p.bin", Resource(body: Resource.bytes(count: 48 << 20, seed: 37)))
        let state = TempDir()
        var unread: [Int32] = [0, 0]
        #expect(pipe(&unread) == 0)
        defer { close(unread[0]) }
        let p = try await CLI.start(["get", server.url("/p.bin"), "-o", "-", "-q"], state: state.path, output: .descriptor(unread[1]))
        close(unread[1])  // the child has its own copy
        defer { p.kill() }
        // More than the pipe and the stream's buffer hold: the reads have had to wait.
        #expect(await eventually { server.bytesSent("/p.bin") > 12 << 20 })
        p.signal(SIGINT)
        #expect(await p.wait() == .exited(130))
    }

    /// `-i -` reads the list from standard input; running it again resumes the same batch.
    @Test func dashIReadsTheListFromStandardInput() async throws {
        let server = try await TestServer.start()
        defer { Task { await server.stop() } }
        let bodies = (0..<2).map { Resource.bytes(count: 70_000 + $0, seed: UInt64(40 + $0)) }
        for (i, b) in bodies.enumerated() { server.set("/l/\(i)", Resource(body: b)) }
        let state = TempDir(), dir = TempDir()
        let list = Array("\(server.url("/l/0")) out=zero\n\(server.url("/l/1"))\n".utf8)
        let r = try await pickup(["get", "-i", "-", "-d", dir.path.string], state: state, input: list)
        #expect(r.status == 0, "\(r.err)")
        #expect(dir.read("zero") == bodies[0] && dir.read("1") == bodies[1], "\(dir.entries)")
        let again = try await pickup(["get", "-i", "-", "-d", dir.path.string], state: state, input: list)
        #expect(again.status == 0 && again.err.contains("2 already there"), "\(again.err)")
        let empty = try await pickup(["get", "-i", "-", "-d", dir.path.string], state: state, input: [])
        #expect(empty.status == 2 && empty.err.contains("standard input lists no URL"), "\(empty.err)")
    }

    /// `-c` / `--continue` are accepted and change nothing (resuming is the default, as --help says).
    @Test func dashCIsAcceptedAndDoesNothing() async throws {
        let server = try await TestServer.start()
        defer { Task { await server.stop() } }
        let body = Resource.bytes(count: 100_000, seed: 36)
        server.set("/c.bin", Resource(body: body))
        let state = TempDir(), dir = TempDir()
        for flag in ["-c", "--continue"] {
            let r = try await pickup(["get", flag, server.url("/c.bin"), "-o", dir.file("c\(flag)").string], state: state)
            #expect(r.status == 0 && dir.read("c\(flag)") == body, "\(flag): \(r.err)")
        }
        #expect(try await pickup(["get", "-c", "--restart", server.url("/c.bin"), "-d", dir.path.string], state: state).status == 2)
        let help = try await pickup(["get", "--help"], state: state)
        let text = String(decoding: help.out, as: UTF8.self)
        #expect(text.contains("--continue") && text.contains("Does nothing: resuming is what pickup always does"), "\(text)")
    }

    /// An unknown option is named (not the value after it, taken for a URL), with exit 2; a URL
    /// taken for -o's value is said so.
    @Test func unknownOptionsAreNamed() async throws {
        let state = TempDir()
        let url = "http://127.0.0.1:9/f"
        for args in [["get", "--tries", "3", url], ["get", url, "--tries=3"], ["add", "--tries", "3", url]] {
            let r = try await pickup(args, state: state)
            #expect(r.status == 2, "\(args): \(r.err)")
            #expect(r.err.lowercased().contains("unknown option '--tries'") && !r.err.contains("URL: 3"), "\(args): \(r.err)")
        }
        let taken = try await pickup(["get", "-o", "https://user:secret@example.com/f"], state: state)
        #expect(taken.status == 2 && taken.err.contains("-o took the URL https://***@example.com/f"), "\(taken.err)")
        #expect(!taken.err.contains("secret"))
    }

    /// 404 and 410 say "not found: URL (status)", the URL's credentials hidden; the exit code is a server error's.
    @Test func notFoundIsSaidSo() async throws {
        let server = try await TestServer.start()
        defer { Task { await server.stop() } }
        server.set("/gone", Resource(body: [1], faults: [.status(410, [:])]))
        let state = TempDir(), dir = TempDir()
        for (path, status) in [("/missing", 404), ("/gone", 410)] {
            let url = server.url(path).replacingOccurrences(of: "http://", with: "http://someone:secret@")
            let r = try await pickup(["get", url, "-d", dir.path.string], state: state)
            #expect(r.status == 4, "\(r.err)")
            let shown = server.url(path).replacingOccurrences(of: "http://", with: "http://***@")
            #expect(r.err == "pickup: not found: \(shown) (\(status))\n", "\(r.err)")
        }
    }

    /// A refused connection names host:port in each retry's line (no lines of zeros); a name that
    /// does not resolve is named.
    @Test func failuresNameTheHost() async throws {
        let state = TempDir(), dir = TempDir()
        let port = try Nginx.freePort()  // nothing listens there
        let r = try await pickup(["get", "http://127.0.0.1:\(port)/f", "-d", dir.path.string, "--retries", "2"], state: state)
        #expect(r.status == 3, "\(r.err)")
        #expect(lines(r.err, containing: "connection refused by 127.0.0.1:\(port); retrying in") == 2, "\(r.err)")
        #expect(r.err.contains("connection refused by 127.0.0.1:\(port) (gave up after 3 attempts"), "\(r.err)")
        #expect(!r.err.contains("0 B"), "no progress lines while nothing answers: \(r.err)")
        let unresolved = try await pickup(["get", "http://no-such-host.invalid:8080/f", "-d", dir.path.string], state: state)
        #expect(unresolved.status == 3 && unresolved.err.contains("cannot resolve no-such-host.invalid"), "\(unresolved.err)")
    }

    /// TLS failures in words: a self-signed certificate not trusted, an expired one (trusted, so
    /// the date is the one fault), one for another name (trusted, so the name is); exit 3 each.
    @Test(.enabled(if: Nginx.binary != nil && FileManager.default.isExecutableFile(atPath: "/usr/bin/openssl"), "nginx or openssl missing"))
    func tlsFailuresAreSaidInWords() async throws {
        let site = TempDir(), state = TempDir(), dir = TempDir(), keys = (0..<3).map { _ in TempDir() }
        site.write("t.bin", Resource.bytes(count: 1000))
        func get(_ certificate: (certificate: String, key: String), trusted: Bool) async throws -> (status: Int32, out: Data, err: String) {
            let nginx = try await Nginx(root: site.path.string, tls: certificate)
            defer { nginx.stop() }
            return try await pickup(["get", nginx.baseURL + "/t.bin", "-d", dir.path.string]
                + (trusted ? ["--ca-certificate", certificate.certificate] : []), state: state)
        }
        let selfSigned = try await get(try await makeCertificate(in: keys[0], for: "127.0.0.1"), trusted: false)
        #expect(selfSigned.status == 3)
        #expect(selfSigned.err.contains("the certificate of 127.0.0.1 is not trusted: it is self-signed"), "\(selfSigned.err)")
        let expired = try await get(try await makeCertificate(in: keys[1], for: "127.0.0.1", expired: true), trusted: true)
        #expect(expired.status == 3)
        #expect(expired.err.contains("the certificate of 127.0.0.1 expired on 2020-01-02"), "\(expired.err)")
        let other = try await get(try await makeCertificate(in: keys[2], for: "other.example"), trusted: true)
        #expect(other.status == 3)
        #expect(other.err.contains("the certificate of 127.0.0.1 is for another name: it names other.example, not 127.0.0.1"), "\(other.err)")
        for r in [selfSigned, expired, other] {
            #expect(!r.err.contains("NIOSSL") && !r.err.contains("BoringSSL") && r.err.split(separator: "\n").count == 1, "\(r.err)")
        }
    }

    /// `pickup serve` on a port in use says so in words, with exit 3.
    @Test func serveOnAPortInUseSaysSo() async throws {
        let server = try await TestServer.start()
        defer { Task { await server.stop() } }
        let root = TempDir(), state = TempDir()
        let r = try await pickup(["serve", "--listen", "127.0.0.1:\(server.port)", "-d", root.path.string, "--state", state.path.string],
                                 state: state)
        #expect(r.status == 3)
        #expect(r.err.contains("pickup: cannot listen on 127.0.0.1:\(server.port): the address is already in use (another pickup serve?)"),
                "\(r.err)")
        #expect(!r.err.contains("errno"), "\(r.err)")
    }

    /// A rerun of a finished download says so once.
    @Test func aRerunSaysItOnce() async throws {
        let server = try await TestServer.start()
        defer { Task { await server.stop() } }
        server.set("/r.bin", Resource(body: Resource.bytes(count: 5000)))
        let state = TempDir(), dir = TempDir()
        let args = ["get", server.url("/r.bin"), "-d", dir.path.string]
        #expect(try await pickup(args, state: state).status == 0)
        let again = try await pickup(args, state: state)
        #expect(again.status == 0)
        #expect(lines(again.err, containing: "already") == 1 && again.err.split(separator: "\n").count == 1, "\(again.err)")
    }

    /// A second URL that is another file is said plainly, with the way to get each; `-Z`
    /// downloads each URL as a file of its own.
    @Test func aMirrorThatIsAnotherFileIsSaidAndDashZTakesEach() async throws {
        let server = try await TestServer.start()
        defer { Task { await server.stop() } }
        let a = Resource.bytes(count: 4 << 20, seed: 37), b = Resource.bytes(count: 1 << 20, seed: 38)
        server.set("/a.bin", Resource(body: a, etag: "\"a\"", bytesPerSecond: 8 << 20))
        server.set("/b.bin", Resource(body: b, etag: "\"b\""))
        let state = TempDir(), dir = TempDir()
        let r = try await pickup(["get", server.url("/a.bin"), server.url("/b.bin"), "-o", dir.file("a").string, "-x", "4"], state: state)
        #expect(r.status == 0 && dir.read("a") == a, "\(r.err)")
        let said = "\(server.url("/b.bin")) is not the same file as \(server.url("/a.bin")) ("
        #expect(lines(r.err, containing: said) == 1, "\(r.err)")
        #expect(r.err.contains("): ignored as a mirror; use -Z to download each URL as its own file"), "\(r.err)")
        // Two connections that got the same answer from it retire it once; the held bytes stay.
        #expect(!r.err.contains("starting over"), "\(r.err)")
        let apart = TempDir()
        let each = try await pickup(["get", "-Z", server.url("/a.bin"), server.url("/b.bin"), "-d", apart.path.string], state: state)
        #expect(each.status == 0 && apart.read("a.bin") == a && apart.read("b.bin") == b, "\(each.err)")
        #expect(try await pickup(["get", "--force-sequential", server.url("/a.bin"), server.url("/b.bin"), "-o", "x"], state: state).status == 2)
    }
}
