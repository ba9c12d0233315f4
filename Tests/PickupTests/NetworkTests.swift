import Foundation
import NIOCore
import NIOHTTP1
import NIOPosix
import NIOSSL
import SystemPackage
import Testing
import TestServer

@testable import Pickup

/// A self-signed certificate for 127.0.0.1 (and its key), made with openssl in `dir`.
func makeLoopbackCertificate(in dir: TempDir) async throws -> (certificate: String, key: String) {
    try await makeCertificate(in: dir, for: "127.0.0.1")
}

/// nginx over TLS serving files from a temporary directory, with a certificate for 127.0.0.1 made
/// for it (both directories live as long as this value; `stop()` stops nginx).
struct TLSNginx {
    let site = TempDir(), keys = TempDir()
    let nginx: Nginx
    let certificate: String

    init(serving files: [String: [UInt8]], http2: Bool = false) async throws {
        for (name, bytes) in files { site.write(name, bytes) }
        let (cert, key) = try await makeLoopbackCertificate(in: keys)
        certificate = cert
        nginx = try await Nginx(root: site.path.string, tls: (cert, key), http2: http2)
    }

    func stop() { nginx.stop() }
}

/// Forward proxying through real proxies (Debian's Squid with its default rules, tinyproxy):
/// plain http in absolute form, https through CONNECT, a proxy's refusal in words.
@Suite(.serialized, .enabled(if: SquidProcess.binary != nil, "squid is not installed"))
struct SquidTests {
    @Test func plainHTTPGoesInAbsoluteFormWithSeveralConnections() async throws {
        let squid = try await SquidProcess()
        defer { squid.stop() }
        let server = try await TestServer.start()
        defer { Task { await server.stop() } }
        let body = Resource.bytes(count: 4 << 20, seed: 41)
        // Paced, so that more connections open before the first has it all.
        server.set("/s.bin", Resource(body: body, bytesPerSecond: 4 << 20))
        let state = TempDir(), dir = TempDir()
        let code = try await CLI.run(["get", server.url("/s.bin"), "-d", dir.path.string, "-q", "-x", "4", "--proxy", squid.url], state: state.path)
        #expect(code == 0, "\(squid.log)")
        let same = dir.read("s.bin") == body
        #expect(same)
        let log = squid.accessLog
        #expect(log.contains("GET http://127.0.0.1:\(server.port)/s.bin"), "\(log)")
        #expect(log.components(separatedBy: "\n").filter { $0.contains("/206 ") }.count >= 2, "several ranges through Squid: \(log)")
        #expect(!log.contains("CONNECT"), "plain http was tunnelled: \(log)")
        #expect(!log.contains("DENIED"), "\(log)")
    }

    @Test(.enabled(if: Nginx.binary != nil && FileManager.default.isExecutableFile(atPath: "/usr/bin/openssl"), "nginx or openssl missing"))
    func httpsGoesThroughCONNECTAndIsVerified() async throws {
        let state = TempDir(), dir = TempDir()
        let body = Resource.bytes(count: 1 << 20, seed: 42)
        let tls = try await TLSNginx(serving: ["t.bin": body])
        defer { tls.stop() }
        let (nginx, cert) = (tls.nginx, tls.certificate)
        // Debian's rules allow CONNECT to 443 only: the test's TLS port is added to SSL_ports.
        let squid = try await SquidProcess(extraSSLPorts: [nginx.port])
        defer { squid.stop() }
        let url = nginx.baseURL + "/t.bin"
        let codes = [try await CLI.run(["get", url, "-o", dir.file("a").string, "-q", "--proxy", squid.url, "--retries", "1"], state: state.path),
             try await CLI.run(["get", url, "-o", dir.file("b").string, "-q", "--proxy", squid.url, "--ca-certificate", cert, "-x", "3"],
                         state: state.path)]
        #expect(codes == [3, 0], "an unknown CA through the tunnel is refused; the right one is trusted: \(squid.log)")
        let same = dir.read("b") == body
        #expect(same)
        #expect(squid.accessLog.contains("CONNECT 127.0.0.1:\(nginx.port)"), "\(squid.accessLog)")
    }

    @Test func aProxysRefusalIsSaidInWordsAndNotRetried() async throws {
        let squid = try await SquidProcess()
        defer { squid.stop() }
        let server = try await TestServer.start()
        defer { Task { await server.stop() } }
        server.set("/r.bin", Resource(body: [1, 2, 3]))
        let state = TempDir(), dir = TempDir()
        // --proxytunnel: CONNECT to a port that is not 443, which Debian's rules deny.
        let result = try await CLI.capture(["get", server.url("/r.bin"), "-d", dir.path.string, "--proxy", squid.url, "--proxytunnel"], state: state.path)
        #expect(result.status == 4, "\(result.err)")
        #expect(result.err.contains("the proxy refused: 403 Forbidden"), "\(result.err)")
        #expect(!result.err.contains("retrying"), "\(result.err)")
        #expect(squid.accessLog.components(separatedBy: "\n").filter { $0.contains("TCP_DENIED/403") }.count == 1, "\(squid.accessLog)")
        #expect(server.requests("/r.bin").isEmpty)
    }
}

@Suite(.serialized, .enabled(if: ProxyProcess.binary(.tinyproxy) != nil, "tinyproxy is not installed"))
struct AbsoluteFormTests {
    @Test func tinyproxySeesAbsoluteFormRequestsAndAsksForCredentials() async throws {
        let proxy = try await ProxyProcess(.tinyproxy, extraConfig: "BasicAuth alice s3cret")
        defer { proxy.stop() }
        let server = try await TestServer.start()
        defer { Task { await server.stop() } }
        let body = Resource.bytes(count: 100_000, seed: 43)
        server.set("/t.bin", Resource(body: body))
        let state = TempDir(), dir = TempDir()
        let withUser = proxy.url.replacingOccurrences(of: "http://", with: "http://alice:s3cret@")
        let (without, with) = (try await CLI.capture(["get", server.url("/t.bin"), "-o", dir.file("a").string, "--proxy", proxy.url], state: state.path),
             try await CLI.capture(["get", server.url("/t.bin"), "-o", dir.file("b").string, "-q", "--proxy", withUser], state: state.path))
        #expect(without.status == 4 && without.err.contains("the proxy needs credentials (407"), "\(without.err)")
        #expect(with.status == 0, "\(with.err) \(proxy.log)")
        let same = dir.read("b") == body
        #expect(same)
        #expect(proxy.absoluteFormRequests(to: server.port) >= 2, "\(proxy.log)")
        #expect(!proxy.log.contains("CONNECT 127.0.0.1:\(server.port)"), "\(proxy.log)")
        #expect(server.requests("/t.bin").count == 1, "the refused request never reached the server")
        #expect(server.requests("/t.bin").first?.headers["proxy-authorization"] == nil, "the proxy's credentials went on to the server")
    }
}

extension AbsoluteFormTests {
    /// Through a proxy, reads wait for a batch of the body (`SO_RCVLOWAT`); a sender slower than
    /// a batch per stall timeout must still count as alive, not stalled.
    @Test func aSlowSenderThroughAProxyIsNotTakenForAStall() async throws {
        let proxy = try await ProxyProcess(.tinyproxy)
        defer { proxy.stop() }
        let server = try await TestServer.start()
        defer { Task { await server.stop() } }
        let body = Resource.bytes(count: 96 << 10, seed: 47)
        server.set("/trickle.bin", Resource(body: body, bytesPerSecond: 32 << 10))
        let state = TempDir(), dir = TempDir()
        let result = try await CLI.capture(["get", server.url("/trickle.bin"), "-o", dir.file("t").string, "-x", "1", "--stall-timeout", "1",
                             "--proxy", proxy.url], state: state.path)
        #expect(result.status == 0, "\(result.err)")
        #expect(!result.err.contains("stalled"), "\(result.err)")
        let same = dir.read("t") == body
        #expect(same)
        #expect(server.requests("/trickle.bin").count == 1)
    }
}

/// Pure parts of the proxy transport: hostile answers never trap.
@Suite struct ProxyParsingTests {
    @Test func statusLinesOfCONNECTAnswers() {
        func parse(_ s: String) -> (Int?, String) {
            let buffer = ByteBuffer(string: s)
            return TunnelHandler.statusLine(buffer.readableBytesView)
        }
        #expect(parse("HTTP/1.1 200 Connection established\r\n\r\n").0 == 200)
        #expect(parse("HTTP/1.0 403 Nope\r\n").0 == 403 && parse("HTTP/1.0 403 Nope\r\n").1 == "Forbidden")
        #expect(parse("HTTP/1.1 299 \u{1B}[31mred\r\n").1 == "[31mred")
        #expect(parse("HTTP/2 200 OK\r\n").0 == nil)
        #expect(parse("HTTP/1.1 2000 OK\r\n").0 == nil)
        #expect(parse("HTTP/1.1 -20 OK\r\n").0 == nil)
        #expect(parse("").0 == nil)
        var rng = SystemRandomNumberGenerator()
        for _ in 0..<2000 {
            let n = Int.random(in: 0..<64, using: &rng)
            let bytes = (0..<n).map { _ in UInt8.random(in: 0...255, using: &rng) }
            let prefix: [UInt8] = Bool.random(using: &rng) ? Array("HTTP/1.1 ".utf8) : []
            var b = ByteBuffer()
            b.writeBytes(prefix + bytes)
            _ = TunnelHandler.statusLine(b.readableBytesView)
            _ = TunnelHandler.headEnd(b.readableBytesView)
        }
    }

    @Test func whoseRefusalItIs() {
        func head(_ status: Int, _ fields: [(String, String)] = []) -> HTTPResponseHead {
            HTTPResponseHead(version: .http1_1, status: .init(statusCode: status), headers: HTTPHeaders(fields))
        }
        #expect(ProxyClientHandler.proxyRefusal(head(407)) == .proxyRefused(status: 407, reason: "Proxy Authentication Required"))
        #expect(ProxyClientHandler.proxyRefusal(head(403, [("X-Squid-Error", "ERR_ACCESS_DENIED 0")]))?.message
            == "the proxy refused: 403 Forbidden")
        #expect(ProxyClientHandler.proxyRefusal(head(502, [("Proxy-Status", "squid; error=connection_refused")]))?.message
            == "the proxy answered 502 Bad Gateway")
        // The origin's own errors pass through to the engine.
        #expect(ProxyClientHandler.proxyRefusal(head(403)) == nil)
        #expect(ProxyClientHandler.proxyRefusal(head(404, [("Proxy-Status", "cache; hit")])) == nil)
        #expect(ProxyClientHandler.proxyRefusal(head(200, [("X-Squid-Error", "x")])) == nil)
    }

    @Test func requestTargets() throws {
        let p = try ProxyTransport.parse("http://u:pw@Example.com:8080/a%20b/c?x=1#frag")
        #expect(p.absolute == "http://Example.com:8080/a%20b/c?x=1")
        #expect(p.origin == "/a%20b/c?x=1" && p.hostField == "Example.com:8080" && !p.isIPAddress)
        let v6 = try ProxyTransport.parse("https://[::1]/f")
        #expect(v6.absolute == "https://[::1]/f" && v6.hostField == "[::1]" && v6.target.port == 443 && v6.isIPAddress)
        #expect(try ProxyTransport.parse("http://h").origin == "/")
        // ftp:// in absolute form (a proxy's FTP gateway); ftps:// never goes through a proxy this way.
        #expect(try ProxyTransport.parse("ftp://h/f").absolute == "ftp://h/f")
        #expect(throws: TransportError.self) { try ProxyTransport.parse("ftps://h/f") }
        #expect(throws: TransportError.self) { try ProxyTransport.parse("gopher://h/f") }
    }
}

/// Servers behind a load balancer whose backends each have their own validators for the same
/// bytes, and servers that are slow to send their first byte.
@Suite struct ServerBehaviourTests {
    @Test func backendsWithTheirOwnETagsConvergeOverOneConnection() async throws {
        let server = try await TestServer.start()
        defer { Task { await server.stop() } }
        let body = Resource.bytes(count: 6 << 20, seed: 44)
        var r = Resource(body: body, bytesPerSecond: 8 << 20)
        r.backendETags = ["\"a-1\"", "\"b-2\"", "\"c-3\""]
        server.set("/lb.bin", r)
        let state = TempDir(), dir = TempDir()
        let result = try await CLI.capture(["get", server.url("/lb.bin"), "-d", dir.path.string, "-x", "6", "--retries", "3"], state: state.path)
        #expect(result.status == 0, "\(result.err)")
        let same = dir.read("lb.bin") == body
        #expect(same)
        #expect(result.err.contains("over one connection"), "\(result.err)")
        // The connections stopped for it end there: none of them asks again.
        #expect(!result.err.contains("retrying"), "\(result.err)")
        // Converged rather than looped: far fewer bytes sent than six rounds of the file.
        #expect(server.bytesSent("/lb.bin") < 3 * body.count, "\(server.bytesSent("/lb.bin"))")
    }

    @Test func afterAKillOnlyAConfirmedValidatorResumes() async throws {
        let server = try await TestServer.start()
        defer { Task { await server.stop() } }
        let body = Resource.bytes(count: 8 << 20, seed: 45)
        // The first response stalls after 2 MiB: the kill comes while it waits, not in a race.
        var r = Resource(body: body, faults: [.stallAfter(2 << 20)])
        r.backendETags = ["\"a-1\"", "\"b-2\""]
        server.set("/k.bin", r)
        let state = TempDir(), dir = TempDir()
        let part = dir.file("k.bin.pickup-part")
        let killed = try await CLI.startAndKill(["get", server.url("/k.bin"), "-o", dir.file("k.bin").string, "-q", "-x", "1"], state: state.path) {
            ((try? FileManager.default.attributesOfItem(atPath: part.string)[.size] as? Int) ?? 0) > 1 << 20
        }
        #expect(killed)
        let code = try await CLI.run(["get", server.url("/k.bin"), "-o", dir.file("k.bin").string, "-q", "-x", "4"], state: state.path)
        #expect(code == 0)
        let same = dir.read("k.bin") == body
        #expect(same)
        // Every resumed range was asked with If-Range; a backend that did not confirm it answered 200.
        let ranged = server.requests("/k.bin").filter { ($0.headers["range"] ?? "bytes=0-").hasPrefix("bytes=0-") == false }
        #expect(ranged.allSatisfy { $0.headers["if-range"] != nil })
    }

    @Test func theSameBytesUnderAnotherETagAreNotSavedTwice() async throws {
        let server = try await TestServer.start()
        defer { Task { await server.stop() } }
        let body = Resource.bytes(count: 300_000, seed: 48)
        server.set("/same.bin", Resource(body: body, etag: "\"server-a\""))
        let state = TempDir(), dir = TempDir()
        let first = try await CLI.run(["get", server.url("/same.bin"), "-d", dir.path.string, "-q"], state: state.path)
        #expect(first == 0)
        // Another server behind the same name: the same bytes, its own ETag.
        server.set("/same.bin", Resource(body: body, etag: "\"server-b\""))
        let again = try await CLI.capture(["get", server.url("/same.bin"), "-d", dir.path.string], state: state.path)
        #expect(again.status == 0, "\(again.err)")
        #expect(again.err.contains("the bytes did not"), "\(again.err)")
        #expect(dir.entries == ["same.bin"], "\(dir.entries)")
        // Other bytes are a new version, saved beside it.
        server.set("/same.bin", Resource(body: Resource.bytes(count: 300_000, seed: 49), etag: "\"server-c\""))
        let changed = try await CLI.run(["get", server.url("/same.bin"), "-d", dir.path.string, "-q"], state: state.path)
        #expect(changed == 0)
        #expect(dir.entries.sorted() == ["same (1).bin", "same.bin"], "\(dir.entries)")
    }

    @Test func aSlowFirstByteMakesTheNextAttemptMorePatient() async throws {
        let server = try await TestServer.start()
        defer { Task { await server.stop() } }
        let body = Resource.bytes(count: 300_000, seed: 46)
        var r = Resource(body: body)
        // The body comes 2 s after the head: with a stall timeout of 0.3 s, the attempts wait
        // 0.3, 0.6, 1.2, then 2.4 s (the torture test's style: a scaled-down 20 s archive).
        r.firstByteDelay = 2
        server.set("/slow.bin", r)
        let state = TempDir(), dir = TempDir()
        let result = try await CLI.capture(["get", server.url("/slow.bin"), "-d", dir.path.string, "-x", "1", "--stall-timeout", "0.3"], state: state.path)
        #expect(result.status == 0, "\(result.err)")
        let same = dir.read("slow.bin") == body
        #expect(same)
        #expect(result.err.contains("waiting up to 1.2 s next time"), "\(result.err)")
        #expect(server.requests("/slow.bin").count >= 3, "\(server.requests("/slow.bin").count)")

        // A dead server still fails, in bounded time: every attempt stalls, each waits longer.
        server.set("/dead.bin", Resource(body: body, faults: Array(repeating: .stallAfter(0), count: 10)))
        let dead = try await CLI.capture(["get", server.url("/dead.bin"), "-d", dir.path.string, "-x", "1", "--stall-timeout", "0.2", "--retries", "3"],
                            state: state.path)
        #expect(dead.status == 3, "\(dead.err)")
        #expect(dead.err.contains("stalled: no data for 0.8 s; waiting up to 1.6 s next time"), "\(dead.err)")
        #expect(dead.err.contains("gave up"), "\(dead.err)")
        #expect(server.requests("/dead.bin").count <= 4)
    }

    @Test func patienceRules() {
        var s = RunState(record: ControlRecord.empty(url: "http://x/"), minSplit: 1 << 20)
        // A stall mid-body on a connection that never stalled: no more patience yet.
        #expect(s.stalled(1, beforeBody: false) == 0)
        // Again on that connection: more.
        #expect(s.stalled(1, beforeBody: false) == 1)
        // Before any body byte: at once.
        #expect(s.stalled(2, beforeBody: true) == 1)
        #expect(s.stalled(2, beforeBody: true) == 2)
        for _ in 0..<40 { s.stalled(3, beforeBody: true) }
        #expect(s.patience[3] == 16)
        var o = HTTPClientTransport.Options()
        o.stallTimeout = 15
        let t = HTTPClientTransport(options: o)
        defer { Task { await t.shutdown() } }
        #expect(t.stallTimeout(patience: 0) == 15 && t.stallTimeout(patience: 1) == 30 && t.stallTimeout(patience: 3) == 120)
        #expect(t.stallTimeout(patience: 16) == 120)
    }
}

/// Closing a TLS connection Pickup no longer wants (a range cut at the end, a finished download)
/// sends its close_notify and does not wait for the peer's (RFC 8446 §6.1): a connection cut
/// while nginx still sends never gets one, and swift-nio-ssl's default wait of 5 s held every
/// exit that long. The wait is bounded to milliseconds; the benchmark measures the exit.
@Suite(.serialized, .enabled(if: Nginx.binary != nil && FileManager.default.isExecutableFile(atPath: "/usr/bin/openssl"),
                             "nginx or openssl missing"))
struct TLSCloseTests {
    /// A TLS connection dropped mid-response (no close_notify) is a dropped connection, retried and
    /// resumed; a certificate failure stays fatal.
    @Test func aCutTLSConnectionIsRetriedNotFatal() {
        let cut = HTTPClientTransport.classify(NIOSSLError.uncleanShutdown, url: "https://example.com/f")
        guard case TransportError.transient(let why)? = cut as? TransportError else {
            Issue.record("\(cut)")
            return
        }
        #expect(why.contains("cut"))
        #expect(TLSFailure(NIOSSLError.uncleanShutdown) == nil)
        let refused = HTTPClientTransport.classify(NIOSSLExtraError.failedToValidateHostname, url: "https://example.com/f")
        guard case TransportError.fatal? = refused as? TransportError else {
            Issue.record("\(refused)")
            return
        }
    }

    /// Network.framework says little of a TLS failure (a direct request on Apple platforms): the
    /// kind is decided by NIOSSL's own verifying handshake, tried here against nginx.
    @Test func nioSSLsHandshakeSaysWhyACertificateFails() async throws {
        let tls = try await TLSNginx(serving: ["a": [1]])
        defer { tls.stop() }
        let loop = MultiThreadedEventLoopGroup.singleton.next()
        let plain = TLSConfiguration.makeClientConfiguration()
        let untrusted = await TLSFailure.verdict(host: "127.0.0.1", port: tls.nginx.port, tls: plain, on: loop)
        #expect(untrusted == .untrusted)
        var trusting = plain
        trusting.additionalTrustRoots = [.certificates(HTTPClientTransport.trustRoots([tls.certificate]))]
        let trusted = await TLSFailure.verdict(host: "127.0.0.1", port: tls.nginx.port, tls: trusting, on: loop)
        #expect(trusted == nil)
        // A certificate for another name, trusted: its name is what fails.
        let site = TempDir(), keys = TempDir()
        let (cert, key) = try await makeCertificate(in: keys, for: "other.example")
        let named = try await Nginx(root: site.path.string, tls: (cert, key))
        defer { named.stop() }
        var trustingOther = plain
        trustingOther.additionalTrustRoots = [.certificates(HTTPClientTransport.trustRoots([cert]))]
        let other = await TLSFailure.verdict(host: "localhost", port: named.port, tls: trustingOther, on: loop)
        #expect(other == .otherName, "the certificate is for other.example")
        #expect(TLSFailure.isNetworkFramework(NIOSSLExtraError.failedToValidateHostname) == false)
    }

    @Test func cutTLSConnectionsAreClosedWithoutWaitingForThePeer() async throws {
        #expect(HTTPClientTransport.tlsShutdownTimeout <= .milliseconds(50))
        let state = TempDir(), dir = TempDir()
        let body = Resource.bytes(count: 24 << 20, seed: 44)
        let tls = try await TLSNginx(serving: ["c.bin": body])
        defer { tls.stop() }
        let (nginx, cert) = (tls.nginx, tls.certificate)
        let result = try await CLI.capture(["get", nginx.baseURL + "/c.bin", "-o", dir.file("c.bin").string, "-x", "8", "--ca-certificate", cert],
                            state: state.path)
        #expect(result.status == 0, "\(result.err)")
        let same = dir.read("c.bin") == body
        #expect(same)
    }
}

/// Extra trust roots (`--ca-certificate`, `SSL_CERT_FILE`, `SSL_CERT_DIR`) are parsed once, each
/// certificate once, rather than by NIOSSL for every TLS context (one per new connection).
@Suite struct TrustRootLoadingTests {
    @Test(.enabled(if: FileManager.default.isExecutableFile(atPath: "/usr/bin/openssl"), "openssl missing"))
    func eachCertificateIsParsedOnceAndUnreadableFilesAreSkipped() async throws {
        let keys = TempDir(), other = TempDir()
        let (cert, _) = try await makeLoopbackCertificate(in: keys)
        let (second, _) = try await makeLoopbackCertificate(in: other)
        keys.write("junk.pem", Array("not a certificate".utf8))
        let roots = HTTPClientTransport.trustRoots([cert, cert, second, keys.file("junk.pem").string, "/nonexistent.pem"])
        #expect(roots.count == 2, "one each of two certificates, from five paths")
        #expect(HTTPClientTransport.trustRoots([second, cert]).count == 2)
    }

    /// `SSL_CERT_FILE` and `SSL_CERT_DIR` naming the platform's own bundle and directory (as many
    /// containers set them) add nothing: NIOSSL trusts those already, and parsing them again cost
    /// every start. Any other file or directory is read.
    @Test(.enabled(if: FileManager.default.isExecutableFile(atPath: "/usr/bin/openssl"), "openssl missing"))
    func theEnvironmentsCopiesOfThePlatformTrustAreNotReadAgain() async throws {
        let keys = TempDir(), linked = TempDir()
        let (cert, _) = try await makeLoopbackCertificate(in: keys)
        let own = HTTPClientTransport.environmentTrustRoots(["SSL_CERT_FILE": cert, "SSL_CERT_DIR": keys.path.string])
        #expect(own.first == cert && own.contains(keys.file("cert.pem").string), "\(own)")
        #expect(HTTPClientTransport.environmentTrustRoots([:]).isEmpty)
        #if os(Linux)
        guard let bundle = HTTPClientTransport.platformBundles.first(where: { FileManager.default.fileExists(atPath: $0) }),
              let directory = HTTPClientTransport.platformDirectories.first(where: { FileManager.default.fileExists(atPath: $0) })
        else { return }
        // Also through a symlink: compared by real path.
        try FileManager.default.createSymbolicLink(atPath: linked.file("bundle.crt").string, withDestinationPath: bundle)
        for env in [["SSL_CERT_FILE": bundle, "SSL_CERT_DIR": directory], ["SSL_CERT_FILE": linked.file("bundle.crt").string]] {
            #expect(HTTPClientTransport.environmentTrustRoots(env).isEmpty, "\(env)")
        }
        let mixed = HTTPClientTransport.environmentTrustRoots(["SSL_CERT_FILE": bundle, "SSL_CERT_DIR": keys.path.string])
        #expect(mixed == HTTPClientTransport.certificateFiles(in: keys.path.string) && !mixed.isEmpty)
        #endif
    }
}

/// Which network stack a request's client runs on (Network.framework on Apple platforms only when
/// nothing needs NIO's sockets and NIOSSL), and Network.framework's TLS failures in words. The
/// stacks themselves are Apple's: read, not run here.
@Suite struct NetworkStackTests {
    @Test func networkFrameworkOnlyForDirectRequestsWithTheSystemsTrust() {
        let proxy = try? ProxyURL(parsing: "socks5h://127.0.0.1:1080")
        #expect(proxy != nil)
        #expect(HTTPClientTransport.stack(networkFramework: true, available: true, proxy: nil, extraTrustRoots: false) == .network)
        #expect(HTTPClientTransport.stack(networkFramework: true, available: true, proxy: proxy, extraTrustRoots: false) == .posix,
                "a configured proxy is spoken to by NIO's handler, never left to the system")
        #expect(HTTPClientTransport.stack(networkFramework: true, available: true, proxy: nil, extraTrustRoots: true) == .posix,
                "roots added to the system's need NIOSSL")
        #expect(HTTPClientTransport.stack(networkFramework: false, available: true, proxy: nil, extraTrustRoots: false) == .posix)
        #expect(HTTPClientTransport.stack(networkFramework: true, available: false, proxy: nil, extraTrustRoots: false) == .posix)
        #if os(Linux)
        #expect(!HTTPClientTransport.networkFrameworkAvailable)
        let t = HTTPClientTransport()
        #expect(t.directStack == .posix && t.directLoops.count == t.loops.count)
        #endif
    }

    @Test func networkFrameworksTLSFailuresAreSaid() {
        for status: Int32 in [-9807, -9808, -9812, -9813, -9814, -9815] { #expect(TLSFailure(status: status) == .untrusted) }
        #expect(TLSFailure(status: -9843) == .otherName)
        #expect(TLSFailure(status: -9806) == .other("Security error -9806"))
        #expect(TLSFailure(status: -9843).sentence(host: "example.com").contains("another name"))
    }
}
