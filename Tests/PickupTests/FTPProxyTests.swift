import Foundation
import HTTPTypes
import NIOSOCKS
import PickupDaemon
import SystemPackage
import Testing
import TestServer

@testable import Pickup

/// Which proxy an ftp:// URL takes, how, and what a credential is bound to: pure.
@Suite struct FTPProxyRuleTests {
    @Test func aCredentialsOriginTakesItsSchemesDefaultPort() throws {
        #expect(Origin("ftp://h/f")?.port == 21)
        #expect(Origin("ftps://h/f")?.port == 21)
        #expect(Origin("https://h/f")?.port == 443)
        #expect(Origin("http://h/f")?.port == 80)
        #expect(Origin("ftp://h/f") == Origin("ftp://h:21/g"))
        // Port 80 of an FTP host is another server: ftp://alice:pw@h/f's login does not go there.
        #expect(Origin("ftp://h/f") != Origin("ftp://h:80/f"))
        #expect(Origin("ftps://h/f") != Origin("ftp://h/f"))
        let login = try RequestHeader(name: "Authorization", value: "Basic YWxpY2U6cHc=")
        func sendsLogin(_ url: String) -> Bool {
            RequestOptions.fields(for: url, original: "ftp://h/f", headers: [login], jar: [], now: 0)
                .contains { $0.name == .authorization }
        }
        #expect(sendsLogin("ftp://h:21/g") && sendsLogin("ftp://H/f"))
        #expect(!sendsLogin("ftp://h:80/f") && !sendsLogin("http://h/f") && !sendsLogin("ftps://h/f"))
    }

    @Test func whichProxyAnFTPURLTakes() throws {
        let env = ["all_proxy": "socks5h://s:1080", "http_proxy": "http://h:3128", "no_proxy": "inside.example"]
        let rules = try ProxyRules.resolve(proxy: nil, noProxy: nil, environment: env)
        #expect(rules.proxy(for: "ftp://a.example/f")?.description == "socks5h://s:1080")
        #expect(rules.proxy(for: "ftps://a.example/f")?.description == "socks5h://s:1080")
        #expect(rules.proxy(for: "ftp://inside.example/f") == nil)
        let ftpOnly = try ProxyRules.resolve(proxy: nil, noProxy: nil, environment: ["ftp_proxy": "http://f:3128"])
        #expect(ftpOnly.proxy(for: "ftp://a.example/f")?.host == "f")
        #expect(ftpOnly.proxy(for: "http://a.example/f") == nil)
        // A proxy set for http only is not bypassed by ftp.
        let httpOnly = try ProxyRules.resolve(proxy: nil, noProxy: nil, environment: ["http_proxy": "http://h:3128"])
        #expect(httpOnly.proxy(for: "ftp://a.example/f")?.host == "h")
        // The daemon's rules (http and https named) cover ftp too.
        let p = try ProxyURL(parsing: "socks5://s:1080")
        #expect(ProxyRules(http: p, https: p).proxy(for: "ftp://a/f") == p)
        #expect(!p.resolvesAtProxy && p.description == "socks5://s:1080")
        #expect(try ProxyURL(parsing: "socks5h://s:1080").resolvesAtProxy)
    }

    @Test func howAnFTPRequestGoesThroughEachProxy() throws {
        let socks = try ProxyRules.resolve(proxy: "socks5h://s:1080", noProxy: nil, environment: [:])
        #expect(try HTTPClientTransport.ftpRoute("ftp://a/f", secure: false, proxies: socks) == .socks(try ProxyURL(parsing: "socks5h://s:1080")))
        let http = try ProxyRules.resolve(proxy: "http://p:3128", noProxy: "direct.example", environment: [:])
        #expect(try HTTPClientTransport.ftpRoute("ftp://a/f", secure: false, proxies: http) == nil, "absolute form through ProxyTransport")
        #expect(try HTTPClientTransport.ftpRoute("ftp://direct.example/f", secure: false, proxies: http) == .direct)
        #expect(throws: TransportError.self) { try HTTPClientTransport.ftpRoute("ftps://a/f", secure: true, proxies: http) }
        let tunnel = try ProxyRules.resolve(proxy: "http://p:3128", noProxy: nil, tunnel: true, environment: [:])
        #expect(try HTTPClientTransport.ftpRoute("ftps://a/f", secure: true, proxies: tunnel) == .tunnel(try ProxyURL(parsing: "http://p:3128")))
        #expect(try HTTPClientTransport.ftpRoute("ftp://a/f", secure: false, proxies: ProxyRules()) == .direct)
        let parsed = try ProxyTransport.parse("ftp://a.example/dir/f%20g.bin")
        #expect(parsed.absolute == "ftp://a.example/dir/f%20g.bin" && parsed.target.port == 21 && !parsed.target.tls)
    }

    @Test func aSOCKSFailureInWords() throws {
        let p = try ProxyURL(parsing: "socks5h://s:1080")
        #expect(SOCKSReady.failure(SOCKSError.ConnectionFailed(reply: .refused), proxy: p)
            == .transient("the SOCKS proxy socks5h://s:1080 could not connect to the FTP server: connection refused"))
        #expect(SOCKSReady.failure(SOCKSError.ConnectionFailed(reply: .notAllowed), proxy: p)
            == .refused("the SOCKS proxy socks5h://s:1080 refuses to connect to the FTP server (not allowed by its rules)"))
        #expect(SOCKSReady.failure(SOCKSError.ConnectionFailed(reply: SOCKSServerReply(value: 200)), proxy: p)
            == .transient("the SOCKS proxy socks5h://s:1080 could not connect to the FTP server: reply 200"))
    }

    @Test func aLoginIsNeverShown() throws {
        let target = try FTPTransport.target("ftp://h/f", headers: [.authorization: "Basic " + Data("ghp_SECRETTOKEN123:pw123".utf8).base64EncodedString()])
        let hidden = FTPTransport.hidingLogin(.refused("530 User ghp_SECRETTOKEN123 cannot log in (pw123)"), of: target)
        #expect(hidden == .refused("530 User *** cannot log in (***)"))
    }
}

/// FTP through real proxies (microsocks, Squid, tinyproxy) to pyftpdlib: the server sees where
/// every connection came from, so a connection that went around the proxy is caught.
@Suite(.serialized, .enabled(if: FTPServerProcess.python != nil, "python3-pyftpdlib is not installed"))
struct FTPProxyTests {
    /// The client addresses of pyftpdlib's sessions that sent a command (its log's `IP:PORT-[user]
    /// prefixes; the launcher's probe, which only connects, left out).
    static func clients(_ ftp: FTPServerProcess) -> Set<String> {
        var found = Set<String>()
        for line in ftp.log.components(separatedBy: "\n") where !line.contains("FTP session opened") && !line.contains("FTP session closed") {
            guard let bracket = line.range(of: "-[") else { continue }
            let head = line[..<bracket.lowerBound]
            let address = head.split(separator: ":").dropLast().last.map(String.init) ?? ""
            if address.split(separator: ".").count == 4 { found.insert(address) }
        }
        return found
    }

    /// microsocks connecting from 127.0.0.2: pyftpdlib sees every session from there, and it
    /// refuses a data connection from another address than its control connection's, so a data
    /// connection that went direct fails the download.
    @Test(.enabled(if: ProxyProcess.binary(.microsocks) != nil, "microsocks is not installed"))
    func controlAndDataGoThroughSOCKS() async throws {
        let site = TempDir(), dir = TempDir(), state = TempDir()
        let body = Resource.bytes(count: 2 << 20, seed: 81)
        site.write("s.bin", body)
        let ftp = try await FTPServerProcess(root: site.path.string, bytesPerSecond: 1 << 20)
        defer { ftp.stop() }
        let proxy = try await ProxyProcess(.microsocks, bindOutgoing: "127.0.0.2")
        defer { proxy.stop() }
        let socksH = proxy.url.replacingOccurrences(of: "socks5://", with: "socks5h://")
        let (named, resolved, env) = (try await CLI.capture(["get", ftp.url("/s.bin"), "-o", dir.file("a").string, "-x", "3", "--proxy", socksH], state: state.path),
             try await CLI.capture(["get", ftp.url("/s.bin"), "-o", dir.file("b").string, "--proxy", proxy.url], state: state.path),
             try await CLI.capture(["get", ftp.url("/s.bin"), "-o", dir.file("c").string], state: state.path, environment: ["all_proxy": socksH]))
        #expect(named.status == 0, "\(named.err) \(ftp.log)")
        #expect(resolved.status == 0, "\(resolved.err) \(ftp.log)")
        #expect(env.status == 0, "\(env.err) \(ftp.log)")
        let same = dir.read("a") == body && dir.read("b") == body && dir.read("c") == body
        #expect(same)
        #expect(ftp.retrievals("/s.bin") >= 3, "\(ftp.log)")
        #expect(Self.clients(ftp) == ["127.0.0.2"], "a session did not come through the proxy: \(ftp.log)")
        #expect(!ftp.log.lowercased().contains("foreign"), "a data connection went around the proxy: \(ftp.log)")
    }

    /// Whether `localhost` names 127.0.0.1 and nothing else here (then a test can use the name).
    static var localhostIsOnlyIPv4Loopback: Bool {
        var hints = addrinfo()
        hints.ai_socktype = Int32(SOCK_STREAM.rawValue)
        var list: UnsafeMutablePointer<addrinfo>?
        guard getaddrinfo("localhost", nil, &hints, &list) == 0, let first = list else { return false }
        defer { freeaddrinfo(first) }
        var node: UnsafeMutablePointer<addrinfo>? = first
        while let n = node {
            guard n.pointee.ai_family == AF_INET, let address = n.pointee.ai_addr else { return false }
            let ip = address.withMemoryRebound(to: sockaddr_in.self, capacity: 1) { $0.pointee.sin_addr.s_addr }
            if ip != inet_addr("127.0.0.1") { return false }
            node = n.pointee.ai_next
        }
        return true
    }

    /// `socks5://` resolves the name here and gives microsocks the address; `socks5h://` gives it
    /// the name (microsocks logs what it was asked to connect to).
    @Test(.enabled(if: ProxyProcess.binary(.microsocks) != nil && localhostIsOnlyIPv4Loopback, "microsocks missing or localhost is not only 127.0.0.1"))
    func socks5ResolvesHereAndSocks5hAtTheProxy() async throws {
        let site = TempDir(), dir = TempDir(), state = TempDir()
        let body = Resource.bytes(count: 300_000, seed: 87)
        site.write("n.bin", body)
        let ftp = try await FTPServerProcess(root: site.path.string)
        defer { ftp.stop() }
        let url = "ftp://localhost:\(ftp.port)/n.bin"
        let here = try await ProxyProcess(.microsocks, bindOutgoing: "127.0.0.2")
        defer { here.stop() }
        let there = try await ProxyProcess(.microsocks, bindOutgoing: "127.0.0.2")
        defer { there.stop() }
        let socksH = there.url.replacingOccurrences(of: "socks5://", with: "socks5h://")
        let (a, b) = (try await CLI.capture(["get", url, "-o", dir.file("a").string, "--proxy", here.url], state: state.path),
             try await CLI.capture(["get", url, "-o", dir.file("b").string, "--proxy", socksH], state: state.path))
        #expect(a.status == 0 && b.status == 0, "\(a.err) \(b.err)")
        let same = dir.read("a") == body && dir.read("b") == body
        #expect(same)
        #expect(here.log.contains("connected to 127.0.0.1:\(ftp.port)") && !here.log.contains("localhost"), "\(here.log)")
        #expect(there.log.contains("connected to localhost:\(ftp.port)"), "\(there.log)")
        #expect(Self.clients(ftp) == ["127.0.0.2"], "\(ftp.log)")
    }

    @Test func aDeadProxyFailsAndNeverGoesDirect() async throws {
        let site = TempDir(), dir = TempDir(), state = TempDir()
        site.write("d.bin", Resource.bytes(count: 10_000, seed: 82))
        let ftp = try await FTPServerProcess(root: site.path.string)
        defer { ftp.stop() }
        let dead = try Nginx.freePort()
        let args = ["get", ftp.url("/d.bin"), "-d", dir.path.string, "--retries", "1"]
        let (socks, env, http, tunnel) = (try await CLI.capture(args + ["--proxy", "socks5h://127.0.0.1:\(dead)"], state: state.path),
             try await CLI.capture(args, state: state.path, environment: ["all_proxy": "socks5://127.0.0.1:\(dead)"]),
             try await CLI.capture(args + ["--proxy", "http://127.0.0.1:\(dead)"], state: state.path),
             try await CLI.capture(args + ["--proxy", "http://127.0.0.1:\(dead)", "--proxytunnel"], state: state.path))
        for (name, r) in [("socks", socks), ("all_proxy", env), ("http", http), ("tunnel", tunnel)] {
            #expect(r.status == 3, "\(name): \(r.status) \(r.err)")
            #expect(r.err.contains("proxy"), "\(name): \(r.err)")
        }
        #expect(Self.clients(ftp).isEmpty, "a download went around the dead proxy: \(ftp.log)")
        #expect(dir.read("d.bin") == nil)
        // --noproxy and no_proxy decide, as for HTTP: then it goes direct.
        let (option, variable) = (try await CLI.capture(["get", ftp.url("/d.bin"), "-o", dir.file("n").string, "--proxy", "socks5h://127.0.0.1:\(dead)", "--noproxy",
                              "127.0.0.1"], state: state.path),
             try await CLI.capture(["get", ftp.url("/d.bin"), "-o", dir.file("v").string], state: state.path,
                             environment: ["all_proxy": "socks5://127.0.0.1:\(dead)", "no_proxy": "127.0.0.1"]))
        #expect(option.status == 0 && variable.status == 0, "\(option.err) \(variable.err)")
        #expect(dir.read("n") == Resource.bytes(count: 10_000, seed: 82) && dir.read("v") == dir.read("n"))
    }

    /// Squid's FTP gateway: `GET ftp://host/path` in absolute form, answered in HTTP. An ftps://
    /// URL it cannot carry is refused in words (exit 4), with no connection to the server.
    @Test(.enabled(if: SquidProcess.binary != nil, "squid is not installed"))
    func throughSquidInAbsoluteForm() async throws {
        let site = TempDir(), dir = TempDir(), state = TempDir()
        let body = Resource.bytes(count: 1 << 20, seed: 83)
        site.write("q.bin", body)
        let ftp = try await FTPServerProcess(root: site.path.string)
        defer { ftp.stop() }
        let squid = try await SquidProcess()
        defer { squid.stop() }
        let secure = ftp.url("/q.bin").replacingOccurrences(of: "ftp://", with: "ftps://")
        let (plain, refused) = (try await CLI.capture(["get", ftp.url("/q.bin"), "-o", dir.file("q").string, "--proxy", squid.url], state: state.path),
             try await CLI.capture(["get", secure, "-o", dir.file("s").string, "--proxy", squid.url], state: state.path))
        #expect(plain.status == 0, "\(plain.err) \(squid.log)")
        let same = dir.read("q") == body
        #expect(same)
        #expect(squid.accessLog.contains("GET ftp://127.0.0.1:\(ftp.port)/q.bin"), "\(squid.accessLog)")
        #expect(refused.status == 4 && refused.err.contains("--proxytunnel"), "\(refused.status) \(refused.err)")
        #expect(dir.read("s") == nil)
        #expect(Self.clients(ftp).allSatisfy { $0 == "127.0.0.1" } && ftp.retrievals("/q.bin") >= 1)
    }

    /// `--proxytunnel`: the control connection through one CONNECT, the data connection through
    /// another to the EPSV port.
    @Test(.enabled(if: ProxyProcess.binary(.tinyproxy) != nil, "tinyproxy is not installed"))
    func throughCONNECTTunnels() async throws {
        let site = TempDir(), dir = TempDir(), state = TempDir()
        let body = Resource.bytes(count: 1 << 20, seed: 84)
        site.write("t.bin", body)
        let ftp = try await FTPServerProcess(root: site.path.string)
        defer { ftp.stop() }
        let proxy = try await ProxyProcess(.tinyproxy)
        defer { proxy.stop() }
        let result = try await CLI.capture(["get", ftp.url("/t.bin"), "-o", dir.file("t").string, "--proxy", proxy.url, "--proxytunnel"], state: state.path)
        #expect(result.status == 0, "\(result.err) \(proxy.log)")
        let same = dir.read("t") == body
        #expect(same)
        let connects = proxy.log.components(separatedBy: "\n").filter { $0.contains("CONNECT 127.0.0.1:") }
        #expect(connects.contains { $0.contains("CONNECT 127.0.0.1:\(ftp.port) ") }, "\(proxy.log)")
        #expect(connects.contains { !$0.contains("CONNECT 127.0.0.1:\(ftp.port) ") }, "no tunnel for the data connection: \(proxy.log)")
    }

    /// A `Link: rel=duplicate` ftp mirror of an http download goes through the SOCKS proxy too.
    @Test(.enabled(if: ProxyProcess.binary(.microsocks) != nil, "microsocks is not installed"))
    func anFTPMirrorFromALinkFieldGoesThroughTheProxy() async throws {
        let site = TempDir(), dir = TempDir(), state = TempDir()
        let body = Resource.bytes(count: 4 << 20, seed: 85)
        site.write("m.bin", body)
        let ftp = try await FTPServerProcess(root: site.path.string, bytesPerSecond: 1 << 20)
        defer { ftp.stop() }
        let proxy = try await ProxyProcess(.microsocks, bindOutgoing: "127.0.0.2")
        defer { proxy.stop() }
        let server = try await TestServer.start()
        defer { Task { await server.stop() } }
        var primary = Resource(body: body, etag: "\"m\"", bytesPerSecond: 1 << 20)
        primary.maxConcurrent = 1
        primary.headers["Link"] = "<\(ftp.url("/m.bin"))>; rel=duplicate; pri=1"
        server.set("/m.bin", primary)
        let result = try await CLI.capture(["get", server.url("/m.bin"), "-o", dir.file("m").string, "-x", "4", "--proxy", proxy.url], state: state.path)
        #expect(result.status == 0, "\(result.err) \(ftp.log)")
        let same = dir.read("m") == body
        #expect(same)
        #expect(ftp.retrievals("/m.bin") >= 1, "the mirror was not used: \(result.err) \(ftp.log)")
        #expect(Self.clients(ftp) == ["127.0.0.2"], "the mirror was reached around the proxy: \(ftp.log)")
        #expect(proxy.connections(to: server.port) >= 1, "\(proxy.log)")
    }

    /// A refused login never shows its user name (a token, often): not on stderr, not in --json.
    @Test func aRefusedLoginDoesNotShowItsUserName() async throws {
        let site = TempDir(), dir = TempDir(), state = TempDir()
        site.write("x.bin", [1, 2, 3])
        let ftp = try await FTPServerProcess(root: site.path.string)
        defer { ftp.stop() }
        let token = "ghp_SECRETTOKEN123"
        let inURL = ftp.url("/x.bin").replacingOccurrences(of: "ftp://", with: "ftp://\(token):pw@")
        let (url, option) = (try await CLI.capture(["get", inURL, "-d", dir.path.string, "--json"], state: state.path),
             try await CLI.capture(["get", ftp.url("/x.bin"), "-d", dir.path.string, "--json", "-u", "\(token):pw"], state: state.path))
        for r in [url, option] {
            #expect(r.status == 4, "\(r.err)")
            #expect(r.err.contains("refused the login as ***"), "\(r.err)")
            #expect(!r.err.contains(token) && !r.out.contains(token), "the user name was shown: \(r.err) \(r.out)")
            #expect(r.out.contains("\"error\""), "\(r.out)")
        }
        #expect(ftp.log.contains("USER"), "the login was not tried: \(ftp.log)")
    }

    /// Nor in the API: the failed download's `error.message`.
    @Test func theAPIDoesNotShowARefusedUserName() async throws {
        let site = TempDir()
        site.write("x.bin", [1, 2, 3])
        let ftp = try await FTPServerProcess(root: site.path.string)
        defer { ftp.stop() }
        try await DaemonFixture().run { f in
            let token = "ghp_SECRETTOKEN123"
            let added = try await f.client.add(APIAddRequest(url: ftp.url("/x.bin").replacingOccurrences(of: "ftp://", with: "ftp://\(token):pw@")))
            var seen = added
            // Polled, bounded: a refused login fails at once (pyftpdlib waits a few seconds before saying so).
            _ = try await eventually(every: 0.1) {
                seen = try await f.client.download(added.id)
                return seen.state == "failed"
            }
            #expect(seen.state == "failed", "\(seen)")
            let message = seen.error?.message ?? ""
            #expect(message.contains("refused the login as ***") && !message.contains(token), "\(message)")
            let listed = try await f.client.list()
            #expect(!"\(listed)".contains(token), "\(listed)")
        }
    }

    /// The login of the first URL does not go to a mirror on another port of the same host.
    @Test func aMirrorOnAnotherPortGetsNoLogin() async throws {
        let site = TempDir(), dir = TempDir(), state = TempDir()
        let body = Resource.bytes(count: 2 << 20, seed: 86)
        site.write("l.bin", body)
        let first = try await FTPServerProcess(root: site.path.string, bytesPerSecond: 1 << 20)
        defer { first.stop() }
        let second = try await FTPServerProcess(root: site.path.string, bytesPerSecond: 1 << 20)
        defer { second.stop() }
        let withLogin = first.url("/l.bin").replacingOccurrences(of: "ftp://", with: "ftp://alice:s3cret@")
        let result = try await CLI.capture(["get", withLogin, second.url("/l.bin"), "-o", dir.file("l").string, "-x", "4"], state: state.path)
        #expect(result.status == 0, "\(result.err)")
        let same = dir.read("l") == body
        #expect(same)
        #expect(second.retrievals("/l.bin") >= 1, "the mirror was not used: \(second.log)")
        #expect(!second.log.contains("alice") && !second.log.contains("s3cret"), "the login went to the mirror: \(second.log)")
        #expect(first.log.contains("alice"), "\(first.log)")
    }
}

/// FTPS (explicit TLS, vsftpd) through a SOCKS5 proxy and through CONNECT tunnels: TLS on both
/// connections inside the proxy's, certificates verified as without one. vsftpd refuses a data
/// connection from another address than its control connection's (`pasv_promiscuous=NO`).
@Suite(.serialized, .enabled(if: VsftpdProcess.binary != nil && FileManager.default.isExecutableFile(atPath: "/usr/bin/openssl"),
                             "vsftpd or openssl missing, or not root"))
struct FTPSProxyTests {
    @Test(.enabled(if: ProxyProcess.binary(.microsocks) != nil && ProxyProcess.binary(.tinyproxy) != nil, "microsocks or tinyproxy missing"))
    func explicitTLSThroughSOCKSAndTunnels() async throws {
        let site = TempDir(), keys = TempDir(), dir = TempDir(), state = TempDir()
        let body = Resource.bytes(count: 1 << 20, seed: 88)
        site.write("p.bin", body)
        chmod(site.file("p.bin").string, 0o644)
        let (cert, key) = try await makeLoopbackCertificate(in: keys)
        let ftp = try await VsftpdProcess(root: site.path.string, certificate: (cert, key))
        defer { ftp.stop() }
        let socks = try await ProxyProcess(.microsocks, bindOutgoing: "127.0.0.2")
        defer { socks.stop() }
        let http = try await ProxyProcess(.tinyproxy)
        defer { http.stop() }
        let url = ftp.url("/p.bin", secure: true)
        let (viaSOCKS, viaTunnel) = (try await CLI.capture(["get", url, "-o", dir.file("s").string, "-x", "2", "--ca-certificate", cert, "--proxy", socks.url], state: state.path),
             try await CLI.capture(["get", url, "-o", dir.file("t").string, "--ca-certificate", cert, "--proxy", http.url, "--proxytunnel"],
                             state: state.path))
        #expect(viaSOCKS.status == 0, "\(viaSOCKS.err) \(ftp.log)")
        #expect(viaTunnel.status == 0, "\(viaTunnel.err) \(ftp.log) \(http.log)")
        let same = dir.read("s") == body && dir.read("t") == body
        #expect(same)
        #expect(ftp.log.contains("Client \"127.0.0.2\", \"RETR"), "\(ftp.log)")
        #expect(socks.connections(to: ftp.port) >= 1, "\(socks.log)")
        #expect(http.log.components(separatedBy: "\n").filter { $0.contains("CONNECT 127.0.0.1:") }.count >= 2, "\(http.log)")
    }
}
