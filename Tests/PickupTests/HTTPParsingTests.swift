import Foundation
import Testing

@testable import Pickup

@Suite struct ContentRangeTests {
    @Test func parsesRangeWithLength() {
        #expect(ContentRange("bytes 0-499/1234") == .range(first: 0, last: 499, complete: 1234))
        #expect(ContentRange("bytes 500-1233/1234") == .range(first: 500, last: 1233, complete: 1234))
        #expect(ContentRange("Bytes 0-0/1") == .range(first: 0, last: 0, complete: 1))
    }

    @Test func parsesUnknownLengthAndUnsatisfied() {
        #expect(ContentRange("bytes 10-19/*") == .range(first: 10, last: 19, complete: nil))
        #expect(ContentRange("bytes */1234") == .unsatisfied(complete: 1234))
    }

    @Test(arguments: [
        "", "bytes", "bytes 5-4/10", "bytes 0-10/10", "bytes -1-5/10", "bytes 0-5", "items 0-5/10", "bytes 0-5/x",
        "bytes a-b/10", "bytes 0-5/10, 6-7/10", "bytes */*", "bytes 0--5/10", "bytes 99999999999999999999-1/2",
    ])
    func rejectsMalformed(_ value: String) {
        #expect(ContentRange(value) == nil)
    }

    @Test func rangeHeader() {
        #expect(ByteRange(first: 0).headerValue == "bytes=0-")
        #expect(ByteRange(first: 100, last: 199).headerValue == "bytes=100-199")
    }
}

@Suite struct ValidatorTests {
    @Test func entityTags() {
        #expect(EntityTag("\"abc\"")?.isWeak == false)
        #expect(EntityTag("W/\"abc\"")?.isWeak == true)
        #expect(EntityTag("abc") == nil)
        #expect(EntityTag("\"a\"b\"") == nil)
        #expect(EntityTag("\"abc\"")!.strongMatches(EntityTag("\"abc\"")!))
        #expect(!EntityTag("W/\"abc\"")!.strongMatches(EntityTag("W/\"abc\"")!))
    }

    @Test func ifRangeUsesStrongETag() {
        let v = Validators(etag: "\"v1\"", lastModified: "Sun, 01 Nov 2020 00:00:00 GMT", date: "Sun, 22 Nov 2026 10:00:00 GMT")
        #expect(v.ifRange == "\"v1\"")
    }

    @Test func ifRangeNeverSendsWeakETagNorDateWhenAnETagExists() {
        // RFC 9110 §13.1.5: no weak tag in If-Range, and a date only when there is no entity tag at all.
        let v = Validators(etag: "W/\"v1\"", lastModified: "Sun, 01 Nov 2020 00:00:00 GMT", date: "Sun, 22 Nov 2026 10:00:00 GMT")
        #expect(v.ifRange == nil)
    }

    @Test func lastModifiedIsStrongOnlySixtySecondsBeforeDate() {
        let strong = Validators(etag: nil, lastModified: "Sun, 22 Nov 2026 09:58:59 GMT", date: "Sun, 22 Nov 2026 10:00:00 GMT")
        #expect(strong.ifRange == "Sun, 22 Nov 2026 09:58:59 GMT")
        let weak = Validators(etag: nil, lastModified: "Sun, 22 Nov 2026 09:59:30 GMT", date: "Sun, 22 Nov 2026 10:00:00 GMT")
        #expect(weak.ifRange == nil)
        let noDate = Validators(etag: nil, lastModified: "Sun, 22 Nov 2026 09:00:00 GMT", date: nil)
        #expect(noDate.ifRange == nil)
    }

    @Test func consistency() {
        let v1 = Validators(etag: "\"v1\"", lastModified: nil, date: nil)
        #expect(v1.consistent(with: Validators(etag: "\"v1\"", lastModified: nil, date: nil)))
        #expect(!v1.consistent(with: Validators(etag: "\"v2\"", lastModified: nil, date: nil)))
        #expect(v1.consistent(with: Validators(etag: nil, lastModified: nil, date: nil)))  // omitted: not a contradiction
    }
}

@Suite struct HTTPDateTests {
    @Test(arguments: ["Sun, 06 Nov 1994 08:49:37 GMT", "Sunday, 06-Nov-94 08:49:37 GMT", "Sun Nov  6 08:49:37 1994"])
    func threeForms(_ value: String) {
        #expect(HTTPDate.parse(value) == 784_111_777)
    }

    @Test func formatRoundTrips() {
        #expect(HTTPDate.format(784_111_777) == "Sun, 06 Nov 1994 08:49:37 GMT")
        #expect(HTTPDate.parse(HTTPDate.format(1_795_000_000)) == 1_795_000_000)
    }

    @Test func theFastFormAgreesWithTheGeneralParser() {
        // Every day of a few centuries at varied times, written as servers write them, and once in lower case.
        var t: Int64 = -2_208_988_800  // 1900
        while t < 4_102_444_800 {  // 2100
            let text = HTTPDate.format(t)
            #expect(HTTPDate.parseFixdate(text) == t)
            #expect(HTTPDate.parseFixdate(text.lowercased().replacingOccurrences(of: "gmt", with: "GMT")) == t)
            t += 86_400 * 13 + 3_607
        }
        #expect(HTTPDate.parseFixdate("Sun, 06 Nov 1994 08:49:3x GMT") == nil)
        #expect(HTTPDate.parseFixdate("Sun, 06 Nox 1994 08:49:37 GMT") == nil)
        #expect(HTTPDate.parseFixdate("Sun, 06 Nov 1994 08:49:37 UTC") == nil)
    }

    @Test func rejectsGarbage() {
        #expect(HTTPDate.parse("yesterday") == nil)
        #expect(HTTPDate.parse("Sun, 32 Nov 1994 08:49:37 GMT") == nil)
        #expect(HTTPDate.parse("Sun, 06 Nov 1994 25:49:37 GMT") == nil)
    }

    @Test func retryAfter() {
        #expect(RetryAfter.seconds("120", now: 0) == 120)
        #expect(RetryAfter.seconds(" 0 ", now: 0) == 0)
        #expect(RetryAfter.seconds("Sun, 06 Nov 1994 08:49:37 GMT", now: 784_111_777 - 30) == 30)
        #expect(RetryAfter.seconds("Sun, 06 Nov 1994 08:49:37 GMT", now: 784_111_777 + 30) == 0)
        #expect(RetryAfter.seconds("-5", now: 0) == nil)
        #expect(RetryAfter.seconds("soon", now: 0) == nil)
    }
}

@Suite struct FileNameTests {
    @Test func plainAndQuoted() {
        #expect(ContentDisposition.filename("attachment; filename=report.pdf") == "report.pdf")
        #expect(ContentDisposition.filename("attachment; filename=\"my \\\"best\\\" file.txt\"") == "my \"best\" file.txt")
        #expect(ContentDisposition.filename("inline") == nil)
    }

    @Test func extendedFormTakesPrecedence() {
        let h = "attachment; filename=\"fallback.txt\"; filename*=UTF-8''na%C3%AFve%20%E2%82%AC.txt"
        #expect(ContentDisposition.filename(h) == "naïve €.txt")
        #expect(ContentDisposition.filename("attachment; filename*=iso-8859-1'en'%A3%20rates.txt") == "£ rates.txt")
        // A broken extended value falls back to the plain one.
        #expect(ContentDisposition.filename("attachment; filename*=UTF-8''%ZZ; filename=ok.txt") == "ok.txt")
    }

    @Test(arguments: [
        ("../../etc/passwd", "_.._etc_passwd"), ("..", nil), (".", nil), ("/", "_"), ("a\u{0}b\u{1F}c", "abc"),
        (".bashrc", "bashrc"), ("C:\\Windows\\evil.exe", "C__Windows_evil.exe"), ("report\u{202E}fdp.exe", "reportfdp.exe"),
        ("  spaced.txt  ", "spaced.txt"), ("", nil),
    ] as [(String, String?)])
    func hostileNames(_ raw: String, _ expected: String?) {
        let safe = SafeFileName.sanitize(raw)
        #expect(safe == expected)
        if let safe { #expect(!safe.contains("/") && safe != ".." && !safe.hasPrefix(".")) }
    }

    @Test func longNamesKeepTheirExtension() {
        let name = String(repeating: "é", count: 300) + ".tar.gz"
        let safe = SafeFileName.sanitize(name)!
        #expect(safe.utf8.count <= 255)
        #expect(safe.hasSuffix(".gz"))
    }

    @Test func urlSegmentsAndNumbering() {
        #expect(SafeFileName.fromURLPath("/files/my%20file.iso") == "my file.iso")
        #expect(SafeFileName.fromURLPath("/") == nil)
        #expect(SafeFileName.fromURLPath("/a/b/") == "b")
        #expect(SafeFileName.fromURLPath("/a/x.bin?name=y") == "x.bin")
        #expect(SafeFileName.fromURLPath("/a/100%25.txt") == "100%.txt")  // decoded once, not twice
        #expect(SafeFileName.rawPath(ofURL: "https://h.example:8443/a/b%20c.iso?x=/y#f") == "/a/b%20c.iso")
        #expect(SafeFileName.rawPath(ofURL: "http://h.example?q=/a") == "")
        #expect(SafeFileName.rawPath(ofURL: "http://h.example") == "")
        #expect(SafeFileName.rawPath(ofURL: "no scheme") == nil)
        #expect(SafeFileName.numbered("a.tar.gz", 2) == "a.tar (2).gz")
        #expect(SafeFileName.numbered("README", 1) == "README (1)")
    }
}

@Suite struct DigestTests {
    @Test func reprDigestPrefersTheStrongest() {
        let sha256 = "X48E9qOokqqrvdts8nOJRJN3OWDUoyWxBf7kbu9DBPE="
        let sha512 = String(repeating: "A", count: 86) + "=="
        let d = DigestHeader.expected(reprDigest: "sha-256=:\(sha256):, sha-512=:\(sha512):", digest: nil)
        #expect(d?.algorithm == .sha512)
        #expect(d?.source == "Repr-Digest")
        #expect(DigestHeader.expected(reprDigest: "sha-256=:\(sha256):", digest: nil)?.algorithm == .sha256)
    }

    @Test func legacyDigestAndMalformed() {
        let d = DigestHeader.expected(reprDigest: nil, digest: "SHA-256=X48E9qOokqqrvdts8nOJRJN3OWDUoyWxBf7kbu9DBPE=")
        #expect(d?.algorithm == .sha256 && d?.source == "Digest")
        #expect(DigestHeader.expected(reprDigest: "sha-256=:short:", digest: "crc32=abc") == nil)
        #expect(DigestHeader.expected(reprDigest: "unknown=:AAAA:", digest: nil) == nil)
    }

    @Test func checksumArgument() {
        let hex = String(repeating: "ab", count: 32)
        #expect(ExpectedDigest(checksumArgument: "sha-256=\(hex)")?.bytes.count == 32)
        #expect(ExpectedDigest(checksumArgument: "SHA256=\(hex.uppercased())")?.hex == hex)
        #expect(ExpectedDigest(checksumArgument: "sha-256=abc") == nil)
        #expect(ExpectedDigest(checksumArgument: "crc32=abcd") == nil)
        #expect(ExpectedDigest(checksumArgument: "md5=\(String(repeating: "zz", count: 16))") == nil)
    }
}

@Suite struct CompletionRecordEncodingTests {
    /// The hand-written JSON of a completion record is what JSONEncoder would write: JSONDecoder
    /// reads it back equal, whatever the strings hold, and with every field set it writes every
    /// field JSONEncoder writes. (It once left out the mirror whose validators a record keeps:
    /// a rerun then asked the first URL with them, and fetched the whole file again.)
    @Test(arguments: [false, true])
    func handWrittenJSONDecodesToTheSameRecord(full: Bool) throws {
        var record = CompletionRecord(
            url: "https://h.example/a \"quoted\" \\ path/\u{1}\u{1F}é€😀?x=1&y=/z", name: "naïve \"résumé\".pdf",
            validators: full ? Validators(etag: EntityTag("W/\"x\\y\""), lastModified: "Sun, 06 Nov 1994 08:49:37 GMT",
                                          lastModifiedIsStrong: true) : nil,
            length: 9_007_199_254_740_993, mtime: -5,
            digest: full ? ExpectedDigest(source: "--checksum", algorithm: .sha256, bytes: Array(0...31)) : nil,
            directory: full ? "/d \"x\"/é" : nil)
        if full { record.source = "https://mirror.example/a \"b\"" }
        let decoded = try JSONDecoder().decode(CompletionRecord.self, from: Data(record.json))
        #expect(decoded == record)
        #expect(decoded == (try JSONDecoder().decode(CompletionRecord.self, from: JSONEncoder().encode(record))))
        func keys(_ data: Data) throws -> Set<String> {
            Set((try JSONSerialization.jsonObject(with: data) as? [String: Any] ?? [:]).keys)
        }
        #expect(try keys(Data(record.json)) == keys(JSONEncoder().encode(record)))
    }
}
