import AsyncHTTPClient
import Foundation
import Testing

@testable import Pickup

/// A small seeded generator, so that a failing case can be reproduced.
struct SplitMix: RandomNumberGenerator {
    var state: UInt64
    mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }
}

/// Generated input from hostile servers and users, through the same functions the CLI and the
/// daemon use. Nothing may trap: a crash here ends the test process.
@Suite struct FuzzTests {
    static let schemes = ["http", "https", "HTTP", "ftp", "", "http:", "javascript", "file", "h\u{0}ttp"]
    static let users = ["", "user@", "user:secret@", ":@", "@", "a:b:c@", "%zz@", "u@@", "\u{7F}@"]
    static let hosts = [
        "127.0.0.1", "localhost", "[::1]", "[::ffff:127.0.0.1]", "[fe80::1%25eth0]", "[", "]", "[::1", "::1",
        "", "256.256.256.256", "0", "0x7f.1", "example.com", "ex ample.com", "xn--nxasmq6b", "é.com",
        String(repeating: "a", count: 300), "a..b", "-a-", "*", "%41", "127.0.0.1.", "1.2.3",
    ]
    static let ports = [
        "", ":", ":0", ":1", ":80", ":65535", ":65536", ":99999", ":4294967296", ":18446744073709551616",
        ":-1", ":+80", ":8a", ": 80", ":０", ":8080:80", ":00000000000000080",
    ]
    static let paths = [
        "", "/", "/x", "/a/../../b", "/%00", "/%", "/%zz", "/\u{0}", "/a b", "/é", "/?q=1", "#frag", "/x#y?z",
        "/" + String(repeating: "x", count: 9000), "//", "/\r\nHost: evil",
    ]

    static func url(_ rng: inout SplitMix) -> String {
        func pick(_ a: [String]) -> String { a[Int(rng.next() % UInt64(a.count))] }
        var s = pick(schemes) + pick(["://", ":/", ":", "//", ":///"]) + pick(users) + pick(hosts) + pick(ports) + pick(paths)
        if rng.next() % 4 == 0 {  // flip a byte
            var bytes = Array(s.utf8)
            if !bytes.isEmpty { bytes[Int(rng.next() % UInt64(bytes.count))] = UInt8(truncatingIfNeeded: rng.next()) }
            s = String(decoding: bytes, as: UTF8.self)
        }
        return s
    }

    /// Every URL ``DownloadURL/check(_:)`` accepts is one AsyncHTTPClient takes with a usable port;
    /// every redirect target is checked the same way.
    @Test func generatedURLsAndRedirectTargetsNeverReachATrap() throws {
        var rng = SplitMix(state: 14)
        var accepted = 0
        for _ in 0..<20_000 {
            let candidate = Self.url(&rng)
            if (try? DownloadURL.check(candidate)) != nil {
                accepted += 1
                if candidate.lowercased().hasPrefix("ftp:") {
                    // FTP's own parsing: an error or a target, never a trap.
                    if let target = try? FTPTransport.target(candidate, headers: [:]) {
                        #expect((1...65535).contains(target.port), "\(candidate)")
                    }
                    continue
                }
                let request = try HTTPClient.Request(url: candidate)
                #expect((1...65535).contains(request.port), "\(candidate)")
                #expect(!DownloadURL.redacted(candidate).contains("secret"))
            }
            let base = ["http://127.0.0.1:8080/a/b", "https://example.com/"][Int(rng.next() % 2)]
            if let next = try? Attempt.resolveRedirect(candidate, from: base, allowInsecure: true) {
                let request = try HTTPClient.Request(url: next)
                #expect((1...65535).contains(request.port), "\(candidate) -> \(next)")
            }
        }
        #expect(accepted > 100, "the generator should produce usable URLs too")
    }

    @Test func knownTrapsAreRefusedWithAReason() {
        for bad in ["http://127.0.0.1:99999/x", "http://[::1]:70000/", "http://127.0.0.1:0/", "http://:80/", "http:///x"] {
            #expect(throws: PickupError.self, "\(bad)") { try DownloadURL.check(bad) }
        }
        #expect(throws: PickupError.self) { try Attempt.resolveRedirect("http://127.0.0.1:99999/", from: "http://a/", allowInsecure: false) }
        #expect(DownloadURL.redacted("https://me:hunter2@example.com/f?x=@") == "https://***@example.com/f?x=@")
        #expect(DownloadURL.redacted("https://ghp_TOKEN@example.com/f") == "https://***@example.com/f")
        #expect(DownloadURL.redacted("https://example.com/a@b") == "https://example.com/a@b")
    }

    static let headerNames = [
        "Content-Range", "Content-Length", "ETag", "Last-Modified", "Date", "Retry-After", "Location",
        "Content-Disposition", "Repr-Digest", "Digest", "Accept-Ranges", "X-Other", "Set-Cookie",
    ]
    static let headerValues = [
        "", " ", "bytes 0-99/100", "bytes */100", "bytes 99-0/100", "bytes 0-99/*", "bytes -1-5/10",
        "bytes 0-9223372036854775807/9223372036854775807", "bytes 9223372036854775806-9223372036854775807/5",
        "bytes 0-18446744073709551616/1", "100", "-1", "99999999999999999999", "\"v1\"", "W/\"v1\"", "\"", "W/",
        "Sun, 06 Nov 1994 08:49:37 GMT", "Sunday, 06-Nov-94 08:49:37 GMT", "Sun Nov  6 08:49:37 1994",
        "Sun, 99 Zzz 99999 99:99:99 GMT", "120", "99999999999999999999999", "/x", "http://127.0.0.1:99999/",
        "attachment; filename=\"../../etc/passwd\"", "attachment; filename*=UTF-8''%e2%80%ae%00x", "filename*=''",
        "attachment; filename=\"a.pickup-part\"", "sha-256=:AAAA:", "sha-256=::", "SHA-256=zz", "md5=",
        String(repeating: "a", count: 70_000), "\u{0}\u{1}\u{7F}", "bytes 0-0/0",
        "=", ";=;", "a=b;=;Domain=", "a=b; Max-Age=-99999999999999999999", "a=b; Max-Age=9223372036854775807",
        "a=b; Domain=..; Path=; Expires=", "a=b; Domain=0.0.1", "=b", "a=b;;;;",
    ]

    /// Random response heads against random request contexts: every decision and header parser
    /// the engine runs on a head.
    @Test func generatedResponseHeadsNeverReachATrap() {
        var rng = SplitMix(state: 9110)
        func pick(_ a: [String]) -> String { a[Int(rng.next() % UInt64(a.count))] }
        let statuses = [0, 100, 200, 204, 206, 301, 302, 304, 307, 308, 400, 404, 408, 416, 429, 500, 503, 599, 999]
        for _ in 0..<5_000 {
            var headers: [(String, String)] = []
            for _ in 0..<Int(rng.next() % 6) { headers.append((pick(Self.headerNames), pick(Self.headerValues))) }
            let head = ResponseHead(status: statuses[Int(rng.next() % UInt64(statuses.count))], headers: headers)
            let offset = Int64(bitPattern: rng.next() % 3 == 0 ? rng.next() : rng.next() % 1000)
            let held = Validators(etag: pick(Self.headerValues), lastModified: pick(Self.headerValues), date: pick(Self.headerValues))
            let context = RequestContext(offset: offset, validators: rng.next() % 2 == 0 ? held : nil,
                                         totalLength: rng.next() % 2 == 0 ? Int64(bitPattern: rng.next()) : nil,
                                         finished: rng.next() % 4 == 0 ? (held, Int64(rng.next() % 200)) : nil)
            _ = ResponseDecision.decide(head, context: context, now: Int64(bitPattern: rng.next() >> 2))
            _ = head["Content-Disposition"].flatMap(ContentDisposition.filename).flatMap(SafeFileName.sanitize)
            _ = DigestHeader.expected(reprDigest: head.combined("Repr-Digest"), digest: head.combined("Digest"))
            _ = head["Retry-After"].flatMap { RetryAfter.seconds($0, now: Int64(bitPattern: rng.next() >> 1)) }
            _ = head.contentLength
            if let cookie = head["Set-Cookie"], let url = URL(string: "https://a.example.com/x/y") {
                _ = Cookie.parseSetCookie(cookie, from: url, now: Int64(bitPattern: rng.next() >> 2))
            }
            _ = Cookie.parseHeader(pick(Self.headerValues), host: "a.example.com")
            _ = try? Cookie.parseNetscape(pick(Self.headerValues))
            _ = Netrc(parsing: pick(Self.headerValues))
            _ = try? RequestHeader(line: pick(Self.headerNames) + ":" + pick(Self.headerValues))
            // Proxies in every form, and what they show.
            let proxyText = pick(["", "http://", "socks5://", "u:p@", "http//"]) + pick(Self.headerValues) + pick(["", ":1", ":65536", "@h:2", "/p"])
            _ = try? ProxyURL(parsing: proxyText)
            _ = ProxyURL.redacted(proxyText)
            _ = Cookie.parseHeader(pick(Self.headerValues), for: "http://" + pick(["a.example.com", "127.0.0.1:8080", "[::1]:1"]) + "/f")
            _ = Cookie.capped([Cookie(name: pick(Self.headerValues), value: "v", domain: pick(Self.headerValues), hostOnly: rng.next() % 2 == 0)])
        }
    }
}
