import Foundation
import SystemPackage
import Testing
import TestServer

@testable import Pickup

@Suite struct RequestOptionsTests {
    @Test func headersAreCheckedAndSecretsBoundToTheirOrigin() throws {
        #expect(throws: PickupError.self) { try RequestHeader(line: "Range: bytes=0-") }
        #expect(throws: PickupError.self) { try RequestHeader(line: "X-A: b\r\nX-Injected: 1") }
        #expect(throws: PickupError.self) { try RequestHeader(line: "no colon") }
        #expect(throws: PickupError.self) { try RequestHeader(line: "Bad Name: x") }
        for control in ["\u{1}", "\u{8}", "\u{B}", "\u{1F}", "\u{7F}", "\u{0}"] {
            #expect(throws: PickupError.self, "a control byte in a value") { try RequestHeader(line: "X-A: a\(control)b") }
        }
        #expect(try RequestHeader(line: "X-Tab: a\tb é").field?.value == "a\tb é")
        let headers = [try RequestHeader(line: "Authorization: Bearer t"), try RequestHeader(line: "X-Plain: v")]
        let cookie = Cookie(name: "s", value: "1", domain: "a.example", hostOnly: true)
        let same = RequestOptions.fields(for: "https://a.example/x", original: "https://a.example/f", headers: headers, jar: [cookie], now: 0)
        #expect(same.map(\.name.rawName) == ["Authorization", "X-Plain", "Cookie"])
        let other = RequestOptions.fields(for: "https://b.example/x", original: "https://a.example/f", headers: headers, jar: [cookie], now: 0)
        #expect(other.map(\.name.rawName) == ["X-Plain"])
        let otherPort = RequestOptions.fields(for: "https://a.example:8443/x", original: "https://a.example/f", headers: headers, jar: [], now: 0)
        #expect(otherPort.map(\.name.rawName) == ["X-Plain"])
        #expect(RequestOptions(headers: headers).redacted.map(\.value) == ["***", "v"])
        #expect(RequestOptions.credentials(in: "http://me:p%40ss@h/")?.value == "Basic " + Data("me:p@ss".utf8).base64EncodedString())
    }

    @Test func netrcEntriesAndTheDefault() {
        let netrc = Netrc(parsing: """
            # comment
            machine files.example login me password s3cret
            machine other.example
              login you
              password pw
            default login anon password guest
            """)
        #expect(netrc.credentials(for: "https://files.example/a") == .basic(user: "me", password: "s3cret"))
        #expect(netrc.credentials(for: "https://OTHER.example/a") == .basic(user: "you", password: "pw"))
        #expect(netrc.credentials(for: "https://elsewhere/a") == .basic(user: "anon", password: "guest"))
        #expect(Netrc(parsing: "machine a login b").credentials(for: "http://c/") == nil)
    }

    @Test func cookiesMatchByDomainPathSecureAndExpiry() throws {
        let text = """
            # Netscape HTTP Cookie File
            .example.com\tTRUE\t/\tFALSE\t0\tall\t1
            example.com\tFALSE\t/dl\tTRUE\t2000000000\tsecure\t2
            #HttpOnly_example.com\tFALSE\t/\tFALSE\t1000\told\t3
            """
        let jar = try Cookie.parseNetscape(text)
        #expect(jar.count == 3)
        func names(_ url: String) -> [String] { jar.filter { $0.matches(URL(string: url)!, now: 1_700_000_000) }.map(\.name) }
        #expect(names("https://example.com/dl/file") == ["all", "secure"])
        #expect(names("http://example.com/dl/file") == ["all"])
        #expect(names("https://cdn.example.com/dl/file") == ["all"])
        #expect(names("https://example.com/dlx") == ["all"])
        #expect(names("https://other.com/") == [])
        #expect(throws: PickupError.self) { try Cookie.parseNetscape("bad line") }
        let u = URL(string: "https://dl.example.com/a/b")!
        let set = Cookie.parseSetCookie("t=x; Domain=example.com; Path=/; Secure; Max-Age=60", from: u, now: 100)
        #expect(set?.hostOnly == false && set?.expires == 160 && set?.secure == true)
        #expect(Cookie.parseSetCookie("t=x; Domain=evil.com", from: u, now: 0) == nil)
        #expect(Cookie.parseSetCookie("t=x", from: u, now: 0)?.path == "/a")
        // An IP address domain-matches only itself: no domain cookie for 0.1 from 127.0.0.1.
        let ip = URL(string: "http://127.0.0.1:8080/f")!
        #expect(Cookie.parseSetCookie("t=x; Domain=0.1", from: ip, now: 0) == nil)
        let own = try #require(Cookie.parseSetCookie("t=x; Domain=127.0.0.1", from: ip, now: 0))
        #expect(own.matches(ip, now: 0) && !own.matches(URL(string: "http://127.1.0.1/f")!, now: 0))
        let jarForIP = try Cookie.parseNetscape("0.1\tTRUE\t/\tFALSE\t0\tz\t1")
        #expect(!jarForIP[0].matches(URL(string: "http://127.1.0.1/f")!, now: 0))
        // Caps: 50 a domain, 300 in all, the newest kept; the Cookie field within 8 KiB.
        let many = (0..<400).map { Cookie(name: "c\($0)", value: String(repeating: "v", count: 100), domain: "d\($0 % 4).example", hostOnly: true) }
        let capped = Cookie.capped(many)
        #expect(capped.count == 200 && capped.last?.name == "c399")
        let sent = RequestOptions.fields(for: "http://d1.example/f", original: "http://d1.example/f", headers: [], jar: capped, now: 0)
        #expect(sent.count == 1 && sent[0].value.utf8.count <= Cookie.maxHeader)
        // A cookie given for a URL goes to its origin only: not to another port or scheme.
        let given = Cookie.parseHeader("g=1", for: "http://127.0.0.1:8080/f")
        #expect(given.count == 1 && given[0].matches(ip, now: 0))
        #expect(!given[0].matches(URL(string: "http://127.0.0.1:9090/f")!, now: 0))
        #expect(!given[0].matches(URL(string: "https://127.0.0.1:8080/f")!, now: 0))
    }

    @Test func inputListOptionLines() throws {
        let list = try InputList(parsing: """
            http://h/a
              header=X-Token: abc def
              user-agent=Agent 1.0
              checksum=md5=\(String(repeating: "0", count: 32))
              out=a.bin
            """)
        let e = try #require(list.entries.first)
        #expect(e.headers.map(\.name) == ["X-Token", "User-Agent"])
        #expect(e.headers.first?.value == "abc def")
        #expect(e.checksum != nil && e.name == "a.bin")
    }

    /// A cookie set by a redirect goes with the requests after it (a login that redirects to the file).
    @Test func cookiesSetAlongARedirectChainAreSentOn() async throws {
        try await Fixture().run { f in
            f.server.set("/file", Resource(body: [7, 8, 9]))
            var r = Resource(body: [], headers: ["Set-Cookie": "ticket=abc; Path=/"])
            r.redirect = (302, "/file")
            f.server.set("/login", r)
            _ = try await f.get("/login")
            #expect(f.server.requests("/file").first?.headers["cookie"] == "ticket=abc")
            #expect(f.dir.read("file") == [7, 8, 9])
        }
    }

    /// Redirected to another origin, the user's Authorization and Cookie stay behind.
    @Test func aRedirectElsewhereDropsTheSecrets() async throws {
        try await Fixture().run { f in
            let other = try await TestServer.start()
            defer { Task { await other.stop() } }
            other.set("/file", Resource(body: [1, 2, 3]))
            var r = Resource(body: [])
            r.redirect = (302, other.url("/file"))
            f.server.set("/start", r)
            let options = RequestOptions(headers: [try RequestHeader(line: "Authorization: Bearer secret"), try RequestHeader(line: "X-Plain: 1")],
                                         cookies: [Cookie(name: "s", value: "ok", domain: "127.0.0.1", hostOnly: true)]
                                            + Cookie.parseHeader("b=bound", for: f.server.url("/start")))
            _ = try await f.downloader.download(DownloadRequest(url: f.server.url("/start"), destination: .directory(f.dir.path), options: options))
            let first = try #require(f.server.requests("/start").first)
            #expect(first.headers["authorization"] == "Bearer secret")
            #expect(first.headers["cookie"] == "s=ok; b=bound")
            let second = try #require(other.requests("/file").first)
            #expect(second.headers["authorization"] == nil)
            #expect(second.headers["x-plain"] == "1")
            // 127.0.0.1 on another port is another origin for the header and for the cookie given for
            // the URL (`-b`, curl's CVE-2022-27776); a jar's host-only cookie is the host's (RFC 6265: no port).
            #expect(second.headers["cookie"] == "s=ok")
            #expect(f.dir.read("file") == [1, 2, 3])
        }
    }
}

/// Downloads that need more than an anonymous GET, against nginx.
@Suite(.serialized, .enabled(if: Nginx.binary != nil, "nginx is not installed"))
struct AuthenticatedNginxTests {
    static let locations = """
        location /private/ { alias $ROOT/; auth_basic "pickup"; auth_basic_user_file $WORK/htpasswd; }
        location /members/ { alias $ROOT/; if ($cookie_session != "ok") { return 403; } }
        location /api/ { alias $ROOT/; if ($http_x_token != "t1") { return 403; } }
        location /agents/ { alias $ROOT/; if ($http_user_agent !~ "^Agent/7") { return 403; } }
        """

    @Test func basicAuthCookiesAndHeadersFromTheCLI() async throws {
        let site = TempDir(), dir = TempDir(), state = TempDir()
        let body = Resource.bytes(count: 300_000, seed: 4)
        site.write("f.bin", body)
        let nginx = try await Nginx(root: site.path.string, locations: Self.locations.replacingOccurrences(of: "$ROOT", with: site.path.string),
                              files: ["htpasswd": "me:{PLAIN}s3cret\n"])
        defer { nginx.stop() }
        let base = nginx.baseURL
        func get(_ path: String, _ extra: [String]) async throws -> Int32 {
            try await CLI.run(["get", base + path, "-o", dir.file(path.replacingOccurrences(of: "/", with: "_")).string, "-q", "--retries", "0"] + extra,
                        state: state.path)
        }
        #expect(try await get("/private/f.bin", []) == 4)
        #expect(try await get("/private/f.bin", ["-u", "me:s3cret"]) == 0)
        #expect(try await CLI.run(["get", base.replacingOccurrences(of: "http://", with: "http://me:s3cret@") + "/private/f.bin",
                             "-o", dir.file("fromurl.bin").string, "-q"], state: state.path) == 0)
        #expect(try await get("/members/f.bin", []) == 4)
        #expect(try await get("/members/f.bin", ["-b", "session=ok"]) == 0)
        let cookies = dir.file("cookies.txt")
        try "127.0.0.1\tFALSE\t/\tFALSE\t0\tsession\tok\n".write(toFile: cookies.string, atomically: true, encoding: .utf8)
        #expect(try await CLI.run(["get", base + "/members/f.bin", "-o", dir.file("fromjar.bin").string, "-q", "--load-cookies", cookies.string],
                            state: state.path) == 0)
        let netrc = dir.file("netrc")
        try "machine 127.0.0.1 login me password s3cret\n".write(toFile: netrc.string, atomically: true, encoding: .utf8)
        #expect(try await CLI.run(["get", base + "/private/f.bin", "-o", dir.file("fromnetrc.bin").string, "-q", "--netrc-file", netrc.string],
                            state: state.path) == 0)
        #expect(dir.read("fromnetrc.bin") == body)
        #expect(try await get("/api/f.bin", ["-H", "X-Token: t1"]) == 0)
        #expect(try await get("/agents/f.bin", ["-A", "Agent/7.0"]) == 0)
        for name in ["_private_f.bin", "fromurl.bin", "_members_f.bin", "fromjar.bin", "_api_f.bin", "_agents_f.bin"] {
            #expect(dir.read(name) == body, "\(name)")
        }
    }

    /// A queued download's headers survive a restart of its manager.
    @Test func theManagerKeepsHeadersAcrossARestart() async throws {
        let site = TempDir(), dir = TempDir(), state = TempDir()
        site.write("f.bin", Resource.bytes(count: 1000, seed: 5))
        let nginx = try await Nginx(root: site.path.string, locations: Self.locations.replacingOccurrences(of: "$ROOT", with: site.path.string),
                              files: ["htpasswd": "me:{PLAIN}s3cret\n"])
        defer { nginx.stop() }
        var config = DownloadManager.Configuration(stateDirectory: state.path.appending("m"))
        config.engine = testOptions(state: state.path)
        config.transport = testTransport()
        let first = try DownloadManager(configuration: config)
        let options = RequestOptions(headers: [.basic(user: "me", password: "s3cret"), try RequestHeader(line: "X-Token: t1")])
        let id = try await first.add(nginx.baseURL + "/private/f.bin", to: .directory(dir.path), paused: true, options: options)
        await first.shutdown()
        let mode = try FileManager.default.attributesOfItem(atPath: state.path.appending("m/manager.sqlite").string)[.posixPermissions] as? Int
        #expect(mode == 0o600)
        let second = try DownloadManager(configuration: config)
        try await second.resume(id)
        #expect(await second.outcome(of: id)?.state == .completed)
        #expect(dir.read("f.bin") == Resource.bytes(count: 1000, seed: 5))
        await second.shutdown()
    }
}
