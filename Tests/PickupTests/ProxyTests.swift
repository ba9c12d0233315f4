import Foundation
import PickupDaemon
import SystemPackage
import Testing
import TestServer

@testable import Pickup

@Suite struct ProxyRuleTests {
    @Test func curlsRulesForTheEnvironmentAndNoProxy() throws {
        let env = ["http_proxy": "http://p1:3128", "HTTPS_PROXY": "socks5h://p2:1080", "no_proxy": "internal.example, .corp,10.0.0.1"]
        let rules = try ProxyRules.resolve(proxy: nil, noProxy: nil, environment: env)
        #expect(rules.proxy(for: "http://a.example/x")?.host == "p1")
        #expect(rules.proxy(for: "https://a.example/x")?.description == "socks5h://p2:1080")  // the form given: the proxy resolves names
        #expect(rules.proxy(for: "http://internal.example/x") == nil)
        #expect(rules.proxy(for: "http://deep.internal.example/x") == nil)
        #expect(rules.proxy(for: "http://host.corp/x") == nil)
        #expect(rules.proxy(for: "http://10.0.0.1/x") == nil)
        // HTTP_PROXY in upper case is not read (httpoxy); an empty --proxy turns proxies off.
        #expect(try ProxyRules.resolve(proxy: nil, noProxy: nil, environment: ["HTTP_PROXY": "http://x:1"]).proxy(for: "http://a/") == nil)
        #expect(try ProxyRules.resolve(proxy: "", noProxy: nil, environment: env).proxy(for: "http://a/") == nil)
        #expect(try ProxyRules.resolve(proxy: "http://q:8080", noProxy: "*", environment: env).proxy(for: "http://a/") == nil)
        #expect(throws: PickupError.self) { try ProxyURL(parsing: "ftp://x:1") }
        #expect(throws: PickupError.self) { try ProxyURL(parsing: "socks5://u:p@x:1") }
        #expect(try ProxyURL(parsing: "http://u:p%40@x:8080").password == "p@")
        // Strict: a typo is refused, not taken for a proxy named "http"; nothing may follow the port.
        #expect(throws: PickupError.self) { try ProxyURL(parsing: "http//u:pw@host:3128") }
        #expect(throws: PickupError.self) { try ProxyURL(parsing: "http://host:3128/path") }
        #expect(throws: PickupError.self) { try ProxyURL(parsing: "http://host:3128?x") }
        #expect(try ProxyURL(parsing: "u:pw@host:3128").host == "host")
        #expect(try ProxyURL(parsing: "http://host:3128/").port == 3128)
        // Shown without user information in every form.
        #expect(ProxyURL.redacted("u:pw@host:3128") == "***@host:3128")
        #expect(ProxyURL.redacted("http://u:pw@host:3128") == "http://***@host:3128")
        #expect(ProxyURL.redacted("host:3128") == "host:3128")
    }
}

/// Through real proxies from Debian's packages (installed by .ci/run); skipped where missing.
@Suite(.serialized) struct ProxyTests {
    /// A response head is decided off the event loop (the sink may touch files): the parts that
    /// came with it wait, and a short response often ends among them, giving its connection back
    /// before reading is on again. Each next request on that kept-alive connection must be read
    /// (it waited for the stall timeout, then failed). Squid keeps the client's connection open.
    @Test(.enabled(if: SquidProcess.binary != nil, "squid is not installed"))
    func aConnectionGivenBackWithItsHeadReadsTheNextResponse() async throws {
        let squid = try await SquidProcess()
        defer { squid.stop() }
        let server = try await TestServer.start()
        defer { Task { await server.stop() } }
        server.set("/k.bin", Resource(body: [1, 2, 3]))
        var options = testTransport(stall: 30)
        options.proxies = try ProxyRules.resolve(proxy: squid.url, noProxy: nil, environment: [:])
        let transport = HTTPClientTransport(options: options)
        for _ in 0..<4 {
            let sink = DocumentSink(limit: 16)
            try await transport.fetch(FetchRequest(url: server.url("/k.bin")), into: sink)
            #expect(sink.head?.status == 200 && sink.bytes == [1, 2, 3])
        }
        await transport.shutdown()
        #expect(server.requests("/k.bin").count == 4)
    }

    @Test(.enabled(if: ProxyProcess.binary(.tinyproxy) != nil, "tinyproxy is not installed"))
    func severalConnectionsThroughAnHTTPProxy() async throws {
        let proxy = try await ProxyProcess(.tinyproxy)
        defer { proxy.stop() }
        let server = try await TestServer.start()
        defer { Task { await server.stop() } }
        let body = Resource.bytes(count: 4 << 20, seed: 21)
        server.set("/p.bin", Resource(body: body))
        let state = TempDir(), dir = TempDir()
        var transport = testTransport(stall: 5)
        transport.proxies = try ProxyRules.resolve(proxy: proxy.url, noProxy: nil, environment: [:])
        let d = Downloader(options: testOptions(state: state.path, connections: 4), transport: transport)
        defer { Task { await d.shutdown() } }
        _ = try await d.download(DownloadRequest(url: server.url("/p.bin"), destination: .directory(dir.path)))
        #expect(dir.read("p.bin") == body)
        #expect(proxy.connections(to: server.port) >= 2, "\(proxy.log)")
    }

    @Test(.enabled(if: ProxyProcess.binary(.microsocks) != nil, "microsocks is not installed"))
    func throughASOCKS5Proxy() async throws {
        let proxy = try await ProxyProcess(.microsocks)
        defer { proxy.stop() }
        let server = try await TestServer.start()
        defer { Task { await server.stop() } }
        let body = Resource.bytes(count: 200_000, seed: 22)
        server.set("/s.bin", Resource(body: body))
        let state = TempDir(), dir = TempDir()
        #expect(try await CLI.run(["get", server.url("/s.bin"), "-d", dir.path.string, "-q", "--proxy", proxy.url], state: state.path) == 0)
        #expect(dir.read("s.bin") == body)
        #expect(proxy.connections(to: server.port) >= 1, "\(proxy.log)")
    }

    @Test(.enabled(if: ProxyProcess.binary(.tinyproxy) != nil, "tinyproxy is not installed"))
    func theEnvironmentsProxyAndNoProxy() async throws {
        let proxy = try await ProxyProcess(.tinyproxy)
        defer { proxy.stop() }
        let server = try await TestServer.start()
        defer { Task { await server.stop() } }
        server.set("/e.bin", Resource(body: [1, 2, 3]))
        let state = TempDir(), dir = TempDir()
        #expect(try await CLI.run(["get", server.url("/e.bin"), "-o", dir.file("a").string, "-q"], state: state.path,
                            environment: ["http_proxy": proxy.url]) == 0)
        #expect(proxy.connections(to: server.port) == 1)
        #expect(try await CLI.run(["get", server.url("/e.bin"), "-o", dir.file("b").string, "-q"], state: state.path,
                            environment: ["http_proxy": proxy.url, "no_proxy": "127.0.0.1"]) == 0)
        #expect(proxy.connections(to: server.port) == 1, "no_proxy went direct")
        #expect(dir.read("a") == [1, 2, 3] && dir.read("b") == [1, 2, 3])
    }
}

/// A server whose certificate only a given CA vouches for.
@Suite(.enabled(if: Nginx.binary != nil && FileManager.default.isExecutableFile(atPath: "/usr/bin/openssl"), "nginx or openssl missing"))
struct TrustTests {
    @Test func caCertificateAndSSLCertFile() async throws {
        let site = TempDir(), dir = TempDir(), state = TempDir(), keys = TempDir()
        site.write("t.bin", Resource.bytes(count: 5000, seed: 3))
        let (cert, key) = try await makeLoopbackCertificate(in: keys)
        let nginx = try await Nginx(root: site.path.string, tls: (cert, key))
        defer { nginx.stop() }
        let url = nginx.baseURL + "/t.bin"
        #expect(try await CLI.run(["get", url, "-o", dir.file("a").string, "-q"], state: state.path) == 3, "an unknown CA is refused")
        #expect(try await CLI.run(["get", url, "-o", dir.file("b").string, "-q", "--ca-certificate", cert], state: state.path) == 0)
        #expect(try await CLI.run(["get", url, "-o", dir.file("c").string, "-q"], state: state.path, environment: ["SSL_CERT_FILE": cert]) == 0)
        #expect(try await CLI.run(["get", url, "-o", dir.file("d").string, "-q", "--ca-certificate", key], state: state.path) == 2)
        #expect(dir.read("b") == Resource.bytes(count: 5000, seed: 3) && dir.read("c") == dir.read("b"))
    }
}

/// The daemon's proxy setting: applied to new transfers, saved for the owner only, shown without its password.
@Suite(.enabled(if: ProxyProcess.binary(.tinyproxy) != nil, "tinyproxy is not installed"))
struct DaemonProxyTests {
    @Test func theProxySettingAppliesSurvivesARestartAndHidesItsPassword() async throws {
        let proxy = try await ProxyProcess(.tinyproxy)
        defer { proxy.stop() }
        try await DaemonFixture().run { f in
            f.server.set("/a.bin", Resource(body: [1, 2, 3]))
            f.server.set("/b.bin", Resource(body: [4, 5, 6]))
            let withUser = proxy.url.replacingOccurrences(of: "http://", with: "http://me:pw@")
            let set = try await f.client.update(APISettingsPatch(proxy: Optional<String?>.some(withUser)))
            #expect(set.proxy == proxy.url.replacingOccurrences(of: "http://", with: "http://***@"))
            let a = try await f.client.add(APIAddRequest(url: f.server.url("/a.bin")))
            try await f.waitUntil { $0[a.id]?.state == "completed" }
            #expect(proxy.connections(to: f.server.port) == 1, "\(proxy.log)")
            let mode = try FileManager.default.attributesOfItem(atPath: f.state.file("settings.json").string)[.posixPermissions] as? Int
            #expect(mode == 0o600)
            #expect(try await f.api(.PATCH, "/settings", body: #"{"proxy":"ftp://x:1"}"#).status == 400)
            await f.stop()
            try await f.start()
            #expect(try await f.client.settings().proxy?.contains("***") == true)
            let b = try await f.client.add(APIAddRequest(url: f.server.url("/b.bin")))
            try await f.waitUntil { $0[b.id]?.state == "completed" }
            #expect(proxy.connections(to: f.server.port) == 2, "the saved proxy applies after a restart")
            // A download that carries a secret does not go through a proxy an API client chose.
            f.server.set("/c.bin", Resource(body: [7, 8, 9]))
            var secret = APIAddRequest(url: f.server.url("/c.bin"))
            secret.headers = ["Authorization": "Bearer not-for-the-proxy"]
            let c = try await f.client.add(secret)
            try await f.waitUntil { $0[c.id]?.state == "completed" }
            #expect(proxy.connections(to: f.server.port) == 2, "a secret went through the API's proxy")
            #expect(f.server.requests("/c.bin").first?.headers["authorization"] == "Bearer not-for-the-proxy")
            _ = try await f.client.update(APISettingsPatch(proxy: Optional<String?>.some(nil)))
            #expect(try await f.client.settings().proxy == nil)
        }
    }

    @Test func absoluteFormByDefaultAndTheTunnelSetting() async throws {
        let proxy = try await ProxyProcess(.tinyproxy)
        defer { proxy.stop() }
        try await DaemonFixture().run { f in
            f.server.set("/t1.bin", Resource(body: [1, 2, 3]))
            f.server.set("/t2.bin", Resource(body: [4, 5, 6]))
            _ = try await f.client.update(APISettingsPatch(proxy: Optional<String?>.some(proxy.url)))
            let a = try await f.client.add(APIAddRequest(url: f.server.url("/t1.bin")))
            try await f.waitUntil { $0[a.id]?.state == "completed" }
            #expect(proxy.absoluteFormRequests(to: f.server.port) == 1, "\(proxy.log)")
            // proxyTunnel: http through CONNECT too, saved with the settings.
            let set = try await f.client.update(APISettingsPatch(proxyTunnel: Optional<Bool?>.some(true)))
            #expect(set.proxyTunnel == true)
            let b = try await f.client.add(APIAddRequest(url: f.server.url("/t2.bin")))
            try await f.waitUntil { $0[b.id]?.state == "completed" }
            #expect(proxy.log.contains("CONNECT 127.0.0.1:\(f.server.port)"), "\(proxy.log)")
            #expect(proxy.absoluteFormRequests(to: f.server.port) == 1)
            #expect(try await f.api(.PATCH, "/settings", body: #"{"proxyTunnel":"yes"}"#).status == 400)
        }
    }
}
