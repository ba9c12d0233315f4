import Foundation
import SystemPackage
import Testing
import TestServer

@testable import Pickup

/// Numbers from outside (header fields, URLs, options) at their extremes: bounded before any
/// arithmetic, so none reaches a trap. A crash here ends the test process.
@Suite struct HostileNumberTests {
    /// Numbers as a hostile server or user writes them.
    static let numbers = [
        "0", "-0", "1", "-1", "00000000000000000001", "0080", "65535", "65536", "2147483648", "4294967296",
        "9223372036854775807", "9223372036854775808", "-9223372036854775808", "-9223372036854775809",
        "18446744073709551616", "99999999999999999999", "999999999999999", "1e300", "-1e300", "inf", "-inf", "nan",
        "1.5", "0x10", "+5", " 5", "5 ", "", "1601", "1600", "9999", "10000", "70", "69", "99", "00",
    ]

    /// Where a number goes in a date: a year, a day, an hour.
    static let dateTemplates = [
        "Sun, 06 Nov # 08:49:37 GMT", "Sunday, 06-Nov-# 08:49:37 GMT", "Sun Nov  6 08:49:37 #",
        "Sun, # Nov 1994 08:49:37 GMT", "Sun, 06 Nov 1994 #:49:37 GMT", "Sun Nov # 08:49:37 1994",
        "Sunday, #-Nov-94 08:49:37 GMT", "Sun, 06 Nov 1994 08:#:37 GMT",
    ]

    /// The exact values a review found trapping (SIGILL): each is no date now.
    @Test func theDatesThatTrappedAreNoDates() throws {
        #expect(HTTPDate.parse("Sun Nov  6 08:49:37 999999999999999") == nil)
        #expect(HTTPDate.parse("Sun Nov  6 08:49:37 9223372036854775807") == nil)
        #expect(HTTPDate.parse("Sunday, 06-Nov-999999999999999 08:49:37 GMT") == nil)
        #expect(HTTPDate.parse("Sun, 06 Nov 1600 08:49:37 GMT") == nil)
        #expect(HTTPDate.parse("Sun, 06 Nov 10000 08:49:37 GMT") == nil)
        #expect(HTTPDate.parse("Mon, 01 Jan 1601 00:00:00 GMT") == -11_644_473_600)
        #expect(HTTPDate.parse("Fri, 31 Dec 9999 23:59:59 GMT") == 253_402_300_799)
        #expect(HTTPDate.parse("Sun, 06 Nov 1994 08:49:37 GMT") == 784_111_777)
        #expect(RetryAfter.seconds("Sun Nov  6 08:49:37 999999999999999", now: 0) == nil)
        #expect(RetryAfter.seconds("0000000000000000000120", now: 0) == 120, "leading zeros are a number")
        #expect(RetryAfter.seconds("99999999999999999999999", now: 0) == 999_999_999_999)
        let v = Validators(etag: nil, lastModified: "Sun Nov  6 08:49:37 9223372036854775807", date: "Sun Nov  6 08:49:37 1994")
        #expect(!v.lastModifiedIsStrong)
        let url = try #require(URL(string: "https://example.com/"))
        let cookie = Cookie.parseSetCookie("a=b; Expires=Sunday, 06-Nov-999999999999999 08:49:37 GMT", from: url, now: 1_700_000_000)
        #expect(cookie?.expires == nil, "no date: a session cookie")
        let forever = Cookie.parseSetCookie("a=b; Max-Age=9223372036854775807", from: url, now: 1_700_000_000)
        #expect(forever?.expires == Int64.max, "a Max-Age past Int64 saturates (it wrapped into the past)")
        #expect(HTTPDate.format(.max) == "Fri, 31 Dec 9999 23:59:59 GMT")
        #expect(HTTPDate.format(.min) == "Mon, 01 Jan 1601 00:00:00 GMT")
    }

    /// A redirect (or a URL) naming a port past Int's range went to port 80.
    @Test func aPortPastIntsRangeIsRefusedNotDefaulted() throws {
        for bad in ["http://127.0.0.1:99999999999999999999/", "ftp://h:99999999999999999999/f", "http://[::1]:18446744073709551616/",
                    "http://u:p@h:9223372036854775808/", "http://h:65536/", "http://h:0/", "http://h:00000/"] {
            #expect(throws: PickupError.self, "\(bad)") { try DownloadURL.check(bad) }
        }
        #expect(throws: PickupError.self) {
            try Attempt.resolveRedirect("http://127.0.0.1:99999999999999999999/", from: "http://a/", allowInsecure: false)
        }
        // The same in a proxy's URL (it went to 3128 or 1080).
        for bad in ["http://h:99999999999999999999", "socks5h://h:65536", "pu:pw@h:18446744073709551616", "h:0"] {
            #expect(throws: PickupError.self, "\(bad)") { try ProxyURL(parsing: bad) }
        }
        #expect((try? ProxyURL(parsing: "h:08080"))?.port == 8080)
        for good in ["http://h:0080/", "http://h:/", "http://h/", "http://u:p@h:8080/x", "http://[::1]:65535/", "http://h:1/"] {
            #expect(throws: Never.self, "\(good)") { try DownloadURL.check(good) }
        }
    }

    /// Seeded: numbers at their extremes in every header parser the engine runs on a head, in
    /// dates, in URLs' ports, and in the seconds options and settings carry. Prints its seed.
    @Test func extremeNumbersInEveryParserNeverTrap() throws {
        let seed = ProcessInfo.processInfo.environment["PICKUP_FUZZ_SEED"].flatMap(UInt64.init) ?? UInt64.random(in: 1...UInt64(1) << 40)
        print("HostileNumberTests seed: \(seed) (PICKUP_FUZZ_SEED=\(seed) replays it)")
        var rng = SplitMix(state: seed)
        func pick(_ a: [String]) -> String { a[Int(rng.next() % UInt64(a.count))] }
        let url = try #require(URL(string: "https://a.example.com/x"))
        var dates = 0
        for _ in 0..<20_000 {
            let n = pick(Self.numbers)
            let date = pick(Self.dateTemplates).replacingOccurrences(of: "#", with: n)
            if let t = HTTPDate.parse(date) {
                dates += 1
                #expect((-11_644_473_600...253_402_300_799).contains(t), "\(date) -> \(t)")
                #expect(HTTPDate.parse(HTTPDate.format(t)) == t)
            }
            let now = Int64(bitPattern: rng.next() >> UInt64(rng.next() % 64))
            _ = RetryAfter.seconds(rng.next() % 2 == 0 ? n : date, now: now)
            _ = Validators(etag: "\"e\"", lastModified: date, date: pick(Self.dateTemplates).replacingOccurrences(of: "#", with: pick(Self.numbers)))
            _ = Cookie.parseSetCookie("a=b; Expires=\(date); Max-Age=\(rng.next() % 3 == 0 ? n : "")", from: url, now: now)
            let head = ResponseHead(status: [200, 206, 416, 503, 429, 301][Int(rng.next() % 6)], headers: [
                ("Content-Length", n), ("Content-Range", "bytes \(pick(Self.numbers))-\(pick(Self.numbers))/\(pick(Self.numbers))"),
                ("Retry-After", rng.next() % 2 == 0 ? n : date), ("Last-Modified", date), ("Date", date),
                ("Location", "http://127.0.0.1:\(n)/"), ("ETag", "\"\(n)\""),
            ])
            let context = RequestContext(offset: Int64(bitPattern: rng.next() >> UInt64(rng.next() % 64)),
                                         validators: Validators(etag: "\"\(n)\"", lastModified: date, date: date),
                                         totalLength: rng.next() % 2 == 0 ? Int64(bitPattern: rng.next()) : nil)
            if case .redirect(let location) = ResponseDecision.decide(head, context: context, now: now),
                let next = try? Attempt.resolveRedirect(location, from: "http://a/", allowInsecure: true)
            {
                let checked = try DownloadURL.check(next)
                #expect((1...65535).contains(checked.port ?? 80), "\(location)")
            }
            _ = head.contentLength
            // URLs with the number as their port: refused, or requested at exactly that port.
            let candidate = "\(pick(["http", "https", "ftp", "ftps"]))://\(pick(["h", "127.0.0.1", "[::1]", "u:p@h"])):\(n)/f"
            if let checked = try? DownloadURL.check(candidate), let port = checked.port {
                #expect(Int(n.drop(while: { $0 == "0" })) == port, "\(candidate) -> \(port)")
            }
            // Seconds from options, settings and computations.
            if let seconds = Double(n) {
                _ = Seconds.nanoseconds(seconds)
                _ = Seconds.timeAmount(seconds)
                _ = TransportError.seconds(seconds)
                if Seconds.isValid(seconds) { #expect(seconds.isFinite && seconds > 0) }
            }
        }
        #expect(dates > 100, "the generator should make valid dates too")
    }

    /// A name cut to fit is checked after the cut: it cannot end like a helper file's name.
    @Test func aNameCutToFitNeverEndsLikeAHelperFile() {
        let raw = String(repeating: "A", count: 220) + ".pickup-part." + String(repeating: "B", count: 40)
        let name = SafeFileName.sanitize(raw)
        #expect(name.map { !SafeFileName.isHelperName($0) } == true, "\(name ?? "nil")")
        for n in [1, 9, 99_999] {
            let numbered = SafeFileName.numbered(String(repeating: "A", count: 231) + ".pickup-part", n)
            #expect(!SafeFileName.isHelperName(numbered), "\(numbered)")
        }
        var rng = SplitMix(state: 31)
        for _ in 0..<2_000 {
            let stem = String(repeating: "é", count: Int(rng.next() % 130))
            let suffix = [".pickup-part", ".pickup-ctl", ".pickup-pos", ".pickup-ctl.tmp"][Int(rng.next() % 4)]
            let tail = String(repeating: "x", count: Int(rng.next() % 60))
            if let name = SafeFileName.sanitize(stem + suffix + (rng.next() % 2 == 0 ? "." + tail : tail)) {
                #expect(!SafeFileName.isHelperName(name), "\(name)")
                #expect(name.utf8.count <= SafeFileName.maxBytes)
            }
        }
    }
}

/// What `CrashGuard` decides from the log a process left.
@Suite struct CrashGuardTests {
    @Test func aDownloadRunningAtTwoDeathsIsHeldBack() {
        // Died twice with 7 running; 3 ran and ended before the second death.
        #expect(CrashGuard.decide("death 7 9\nstart\nrun 3\nrun 7\nend 3\n") == .init(suspects: [7], lastDeath: [7]))
        // A clean end: nothing held back, the earlier death carried on.
        #expect(CrashGuard.decide("death 7\nstart\nrun 7\nclean\n") == .init(suspects: [], lastDeath: [7]))
        // One death only: nothing held back yet.
        #expect(CrashGuard.decide("start\nrun 7\n") == .init(suspects: [], lastDeath: [7]))
        // No log: a first start.
        #expect(CrashGuard.decide("") == .init(suspects: [], lastDeath: nil))
        // A log that filled up decides nothing (what ended could not be written).
        #expect(CrashGuard.decide("death 7\nstart\nrun 7\n\nfull\n") == .init(suspects: [], lastDeath: nil))
        // Garbage and numbers past Int64 are no ids.
        #expect(CrashGuard.decide("death 99999999999999999999 x\nstart\nrun -1 99999999999999999999\n")
            == .init(suspects: [], lastDeath: [-1]))
    }

    /// The log as a manager writes it across processes: kills are simulated by not shutting down.
    @Test func aManagerHoldsBackWhatRanAtEachOfTheLastTwoDeaths() async throws {
        let state = TempDir()
        let (first, none) = CrashGuard.start(in: state.path)
        #expect(none.isEmpty)
        await first?.running(5)
        await first?.running(6)
        first?.ended(6)
        let (second, once) = CrashGuard.start(in: state.path)  // the first died with 5 running
        #expect(once.isEmpty)
        await second?.running(5)
        let (third, twice) = CrashGuard.start(in: state.path)  // and again
        #expect(twice == [5])
        await third?.running(5)
        await third?.clean()
        let (_, after) = CrashGuard.start(in: state.path)  // a clean end holds back nothing
        #expect(after.isEmpty)
    }
}

/// The same extremes as options of the real binary: a usage error (exit 2) naming the option,
/// never a signal.
@Suite(.serialized) struct HostileOptionTests {
    @Test func extremeOptionValuesAreUsageErrors() async throws {
        let state = TempDir(), dir = TempDir()
        let url = "http://127.0.0.1:9/f"
        var cases: [[String]] = []
        for value in ["inf", "-inf", "nan", "1e300", "-1", "0", "86401", "99999999999999999999"] {
            cases.append(["get", url, "-d", dir.path.string, "--stall-timeout", value])
            cases.append(["serve", "--dir", dir.path.string, "--stall-timeout", value])
            cases.append(["get", url, "-d", dir.path.string, "--hook-timeout", value])
        }
        for (option, value) in [("--retries", "99999999999999999999"), ("--retries", "-1"), ("--retries", "1001"),
                                ("--connections", "9223372036854775808"), ("--connections", "0"), ("--max-size", "1e300"), ("--max-size", "inf"),
                                ("--limit-rate", "nan"), ("--limit-rate", "-5"), ("--limit-rate", "99999999999999999999G")] {
            cases.append(["get", url, "-d", dir.path.string, option, value])
        }
        for args in cases {
            let r = try await CLI.capture(args, state: state.path)
            #expect(r.status == 2, "\(args): exit \(r.status): \(r.err)")
            #expect(r.err.split(separator: "\n").contains { $0.contains(args[args.count - 2]) }, "\(args): \(r.err)")
        }
    }

    /// The review's case: a Metalink document's `size` and piece hashes, no whole-file hash; its
    /// first URL serves one byte more of another file, its second the file. The first is retired
    /// for its length and the file saved is the document's; alone, the wrong one fails (exit 5).
    @Test func aMirrorAnnouncingAnotherLengthIsNotTrusted() async throws {
        let server = try await TestServer.start()
        let dir = TempDir(), state = TempDir(), docs = TempDir()
        let body = Resource.bytes(count: 4_194_304, seed: 31)
        server.set("/evil.bin", Resource(body: Resource.bytes(count: 4_194_305, seed: 66), etag: "\"evil\""))
        server.set("/good.bin", Resource(body: body, etag: "\"good\""))
        func document(_ urls: [String]) -> [UInt8] {
            MetalinkTests.document(files: """
                  <file name="f.bin"><size>4194304</size>\(MirrorTests.piecesElement(body, length: 1 << 18))
                  \(urls.enumerated().map { "<url priority=\"\($0.offset + 1)\">\(server.url($0.element))</url>" }.joined())</file>
                """)
        }
        /// `pickup get --metalink` on the document `text`, into `into`.
        func get(_ text: [UInt8], into: TempDir, _ extra: [String] = []) async throws -> (status: Int32, out: String, err: String) {
            let name = "\(UUID().uuidString).meta4"
            docs.write(name, text)
            return try await CLI.capture(["get", "--metalink", docs.file(name).string, "-d", into.path.string] + extra, state: state.path)
        }
        let both = try await get(document(["/evil.bin", "/good.bin"]), into: dir, ["-x", "2"])
        #expect(both.status == 0, "\(both.err)")
        let same = dir.read("f.bin") == body
        #expect(same, "the file saved is not the document's")
        #expect(both.err.contains("evil.bin") && both.err.contains("retired"), "\(both.err)")

        let other = TempDir()
        let alone = try await get(document(["/evil.bin"]), into: other)
        #expect(alone.status == 5, "exit \(alone.status): \(alone.err)")
        #expect(alone.err.contains("4194305"), "\(alone.err)")
        #expect(!FileManager.default.fileExists(atPath: other.file("f.bin").string))

        // Piece hashes that do not cover the size are not dropped: the download fails, saying why.
        let short = try await get(MetalinkTests.document(files: """
              <file name="g.bin"><size>4194304</size>\(MirrorTests.piecesElement(Array(body.prefix(1 << 20)), length: 1 << 18))
              <url>\(server.url("/good.bin"))</url></file>
            """), into: other)
        #expect(short.status == 5, "exit \(short.status): \(short.err)")
        #expect(short.err.contains("piece hashes"), "\(short.err)")
        #expect(!FileManager.default.fileExists(atPath: other.file("g.bin").string))

        // Malformed piece hashes: the document's file is refused, not downloaded unchecked.
        let bad = try await get(MetalinkTests.document(files: """
              <file name="h.bin"><size>4194304</size><pieces length="262144" type="sha-256"><hash>zz</hash></pieces>
              <url>\(server.url("/good.bin"))</url></file>
            """), into: other)
        #expect(bad.status == 5, "exit \(bad.status): \(bad.err)")
        #expect(!FileManager.default.fileExists(atPath: other.file("h.bin").string))
        await server.stop()
    }
}
