import Foundation
import Testing
import TestServer

@testable import Pickup

/// Metalink 4 documents (RFC 5854) and Metalink/HTTP `Link` headers (RFC 6249): what they say,
/// and that nothing a hostile file or server sends traps or gets through unbounded.
@Suite struct MetalinkTests {
    static let sha256 = String(repeating: "ab", count: 32)
    static let piece = String(repeating: "cd", count: 32)

    static func document(files: String) -> [UInt8] {
        Array("""
            <?xml version="1.0" encoding="UTF-8"?>
            <metalink xmlns="urn:ietf:params:xml:ns:metalink">
              <generator>test</generator>
            \(files)
            </metalink>
            """.utf8)
    }

    static let sample = document(files: """
          <file name="image.iso">
            <size>600</size>
            <hash type="sha-256">\(sha256)</hash>
            <hash type="md5">0123456789abcdef0123456789ABCDEF</hash>
            <pieces length="256" type="sha-256">
              <hash>\(piece)</hash><hash>\(piece)</hash><hash>\(piece)</hash>
            </pieces>
            <url priority="2" location="de">http://b.example/image.iso?a=1&amp;b=2</url>
            <url>https://c.example/image.iso</url>
            <url priority="1">ftp://a.example/pub/image.iso</url>
            <url priority="1">gopher://old.example/image.iso</url>
            <metaurl mediatype="torrent">http://t.example/image.torrent</metaurl>
          </file>
          <file name="../../etc/notes.txt">
            <url>http://a.example/notes.txt</url>
          </file>
        """)

    @Test func filesSizesHashesPiecesAndMirrorsByPriority() throws {
        let m = try Metalink.parse(Self.sample)
        #expect(m.files.count == 2)
        let iso = try #require(m.files.first)
        #expect(iso.name == "image.iso")
        #expect(iso.size == 600)
        #expect(iso.strongestHash?.algorithm == .sha256)
        #expect(iso.strongestHash?.bytes == [UInt8](repeating: 0xAB, count: 32))
        #expect(iso.hashes.count == 2)
        #expect(iso.pieces?.length == 256 && iso.pieces?.hashes.count == 3 && iso.pieces?.algorithm == .sha256)
        // Priority 1 first, then 2, then none; an unsupported scheme is left out; `&amp;` is `&`.
        #expect(iso.mirrors.map(\.url) == ["ftp://a.example/pub/image.iso", "http://b.example/image.iso?a=1&b=2", "https://c.example/image.iso"])
        #expect(iso.mirrors[1].location == "de")
        // A name is sanitized as a server-suggested one: no way out of the download directory.
        #expect(m.files[1].name == SafeFileName.sanitize("../../etc/notes.txt") && !m.files[1].name.contains("/"))
    }

    /// Piece hashes that do not cover the size are kept (the download refuses them, saying why:
    /// never a silent drop); malformed ones, or only hashes of unknown types, make the file
    /// uncheckable.
    @Test func hashesThatCannotCheckTheFileAreNotDroppedInSilence() throws {
        let m = try Metalink.parse(Self.document(files: """
              <file name="a.bin"><size>1000</size>
                <pieces length="256" type="sha-256"><hash>\(Self.piece)</hash></pieces>
                <url>http://a.example/a.bin</url></file>
            """))
        let pieces = try #require(m.files.first?.pieces)
        #expect(pieces.count(total: 1000) == nil)
        // A size near Int64.max: the count of pieces it needs is worked out without overflowing
        // (`size + length - 1` trapped).
        let huge = try Metalink.parse(Self.document(files: """
              <file name="h.bin"><size>\(Int64.max)</size>
                <pieces length="256" type="sha-256"><hash>\(Self.piece)</hash></pieces>
                <url>http://a.example/h.bin</url></file>
            """))
        #expect(huge.files.first?.size == Int64.max)
        #expect(huge.files.first?.pieces.map { $0.count(total: Int64.max) == nil } == true)
        let bad = try Metalink.parse(Self.document(files: """
              <file name="b.bin"><size>256</size><pieces length="256" type="sha-256"><hash>zz</hash></pieces>
                <url>http://a.example/b.bin</url></file>
              <file name="c.bin"><size>256</size><pieces type="sha-3"><hash>\(Self.piece)</hash></pieces>
                <url>http://a.example/c.bin</url></file>
              <file name="d.bin"><hash type="sha-384">00</hash><url>http://a.example/d.bin</url></file>
              <file name="e.bin"><hash type="sha-384">00</hash><hash type="sha-256">\(Self.piece)</hash>
                <url>http://a.example/e.bin</url></file>
            """))
        #expect(bad.files.map { $0.uncheckable != nil } == [true, true, true, false])
        #expect(bad.files[2].uncheckable?.contains("sha-384") == true)
    }

    @Test func hostileDocumentsAreRefusedInOneLine() {
        func reason(_ bytes: [UInt8]) -> String? {
            do {
                _ = try Metalink.parse(bytes)
                return nil
            } catch {
                return error.description
            }
        }
        let laughs = Array("""
            <?xml version="1.0"?><!DOCTYPE lolz [<!ENTITY lol "lol"><!ENTITY lol2 "&lol;&lol;&lol;&lol;">]>
            <metalink xmlns="urn:ietf:params:xml:ns:metalink"><file name="&lol2;"><url>http://a/x</url></file></metalink>
            """.utf8)
        #expect(reason(laughs)?.contains("DOCTYPE") == true)
        let external = Array("""
            <?xml version="1.0"?><!doctype m [<!ENTITY x SYSTEM "file:///etc/passwd">]><metalink xmlns="urn:ietf:params:xml:ns:metalink"/>
            """.utf8)
        #expect(reason(external)?.contains("DOCTYPE") == true)
        let deep = Self.document(files: String(repeating: "<x>", count: 40) + String(repeating: "</x>", count: 40))
        #expect(reason(deep)?.contains("nested deeper") == true)
        let huge = Self.document(files: String(repeating: " ", count: Metalink.maxBytes))
        #expect(reason(huge)?.contains("over 4 MiB") == true)
        #expect(reason(Array("<metalink xmlns=\"urn:ietf:params:xml:ns:metalink\"><file".utf8)) != nil)
        #expect(reason(Array("<metalink xmlns=\"urn:ietf:params:xml:ns:metalink\"><file name=\"\u{FF}\"/></metalink>".utf8) + [0xFF])?.contains("UTF-8") == true)
        #expect(reason(Array("<?xml version=\"1.0\" encoding=\"UTF-16\"?><metalink/>".utf8))?.contains("encoding") == true)
        // Seeds the fuzz test found that crashed Foundation's XMLParser (a processing instruction
        // without data; a misplaced declaration).
        #expect(reason(Self.document(files: "<?x?>"))?.contains("processing instruction") == true)
        #expect(reason(Array("<?x?>".utf8) + Self.sample)?.contains("processing instruction") == true)
        #expect(reason(Array("<metalink><file name=\"a\"><url>http://a/a</url></file></metalink>".utf8))?.contains("not a Metalink 4") == true)
        #expect(reason(Self.document(files: "<file name=\"a\"><url>gopher://a/a</url></file>"))?.contains("names no file") == true)
        let twice = Self.document(files: "<file name=\"a\"><url>http://a/a</url></file><file name=\"a\"><url>http://b/a</url></file>")
        #expect(reason(twice)?.contains("twice") == true)
        for r in [reason(laughs), reason(deep), reason(huge)] { #expect(r.map { !$0.contains("\n") } ?? false) }
    }

    /// Random cuts, repeats and byte flips of a valid document: each parses or is refused, none traps.
    @Test func mutatedDocumentsNeverTrap() {
        var rng = SystemRandomNumberGenerator()
        let seed = ProcessInfo.processInfo.environment["PICKUP_FUZZ_SEED"].flatMap { UInt64($0) } ?? UInt64.random(in: 0...UInt64.max, using: &rng)
        print("Metalink fuzz seed \(seed) (replay with PICKUP_FUZZ_SEED=\(seed))")
        var random = SplitMix(state: seed)
        let base = Self.sample
        let pieces: [[UInt8]] = ["<", ">", "</file>", "<file name=\"x\">", "&amp;", "&#0;", "&#xD800;", "&#x10FFFF;", "<url>", "http://", "\"", "\u{0}",
                                 "é", "\u{FFFF}", "<size>-1</size>", "<a:b xmlns:a=\"é\" a:c=\"é\">", "<?pi é?>", "<!-- é -->", "<![CDATA[é]]>",
                                 "<?xml version=\"1.0\" encoding=\"ISO-8859-1\"?>", "<pieces length=\"0\" type=\"sha-256\">",
                                 "<hash type=\"sha-256\">zz</hash>", "<size>99999999999999999999</size>", "\u{FEFF}"].map { Array($0.utf8) }
        let printable = Array(" !\"#&'()*+,-./0123456789:;<=>?@AZaz[]_{}~".utf8)
        for _ in 0..<3000 {
            var bytes = base
            for _ in 0..<(1 + Int(random.next() % 4)) {
                guard !bytes.isEmpty else { break }
                let at = Int(random.next() % UInt64(bytes.count))
                switch random.next() % 3 {
                case 0: bytes.removeSubrange(at..<min(bytes.count, at + Int(random.next() % 40)))
                case 1: bytes.insert(contentsOf: pieces[Int(random.next() % UInt64(pieces.count))], at: at)
                default:
                    // Mostly printable ASCII (so that most documents get past the UTF-8 check and
                    // into the parser), sometimes any byte.
                    bytes[at] = random.next() % 8 == 0 ? UInt8(truncatingIfNeeded: random.next()) : printable[Int(random.next() % UInt64(printable.count))]
                }
            }
            if let dump = ProcessInfo.processInfo.environment["PICKUP_FUZZ_DUMP"] { _ = FileManager.default.createFile(atPath: dump, contents: Data(bytes)) }
            if let m = try? Metalink.parse(bytes) {
                #expect(!m.files.isEmpty)
                for f in m.files { #expect(!f.name.contains("/") && !f.mirrors.isEmpty) }
            }
        }
    }

    @Test func linkHeadersNameMirrorsAndTheMetalink() {
        let values = [
            #"<http://b.example/f.iso>; rel=duplicate; pri=2; geo=de, <ftp://a.example/f.iso>; rel="duplicate"; pri=1"#,
            #"<https://c.example/f.iso>; rel=duplicate, <gopher://x/f>; rel=duplicate, <http://m.example/f.meta4>; rel=describedby; type="application/metalink4+xml""#,
            #"<http://d.example/f.iso>; title="a, b; c"; rel=duplicate"#,
            #"<http://e.example/f.iso>; rel=alternate"#,
        ]
        #expect(LinkHeader.duplicates(values).map(\.url)
            == ["ftp://a.example/f.iso", "http://b.example/f.iso", "https://c.example/f.iso", "http://d.example/f.iso"])
        #expect(LinkHeader.duplicates(values).first?.priority == 1)
        #expect(LinkHeader.metalink(values) == "http://m.example/f.meta4")
        #expect(LinkHeader.links(values).first { $0.target == "http://d.example/f.iso" }?.parameters["title"] == "a, b; c")
    }

    @Test func fuzzedLinkHeadersNeverTrap() {
        var rng = SystemRandomNumberGenerator()
        let seed = UInt64.random(in: 0...UInt64.max, using: &rng)
        print("Link header fuzz seed \(seed)")
        var random = SplitMix(state: seed)
        let pieces = ["<", ">", ";", ",", "=", "\"", "\\", " ", "rel", "duplicate", "pri", "http://a/b", "9999999999999999999999", "-1", "é", "\t"]
        for _ in 0..<3000 {
            let n = Int(random.next() % 24)
            let value = (0..<n).map { _ in pieces[Int(random.next() % UInt64(pieces.count))] }.joined()
            #expect(LinkHeader.links([value]).count <= LinkHeader.maxLinks)
            // Whatever the field, a mirror it yields is a URL Pickup can fetch.
            for mirror in LinkHeader.duplicates([value]) { #expect((try? DownloadURL.check(mirror.url)) != nil, "\(value)") }
            _ = LinkHeader.metalink([value])
        }
        let many = String(repeating: "<http://a/b>; rel=duplicate, ", count: 1000)
        #expect(LinkHeader.links([many]).count == LinkHeader.maxLinks)
    }
}

/// A URL that answers with a Metalink document (`Content-Type: application/metalink4+xml`).
@Suite struct MetalinkAnswerTests {
    static func documentResource(_ document: [UInt8]) -> Resource {
        var r = Resource(body: document, etag: "\"doc\"")
        r.headers["Content-Type"] = "Application/Metalink4+XML; charset=utf-8"
        return r
    }

    @Test func theDocumentIsReadNotSavedWhenFollowed() async throws {
        try await Fixture(connections: 2).run { f in
            let document = MetalinkTests.document(files: """
                  <file name="image.bin"><size>5</size><url>\(f.server.url("/image.bin"))</url></file>
                """)
            f.server.set("/get/image", Self.documentResource(document))
            var request = DownloadRequest(url: f.server.url("/get/image"), destination: .directory(f.dir.path))
            request.followMetalink = true
            let result = try await f.downloader.download(request)
            #expect(result.outcome == .metalink)
            #expect(result.metalink?.files.map(\.name) == ["image.bin"])
            #expect(f.dir.entries.isEmpty, "\(f.dir.entries)")
            // Not followed: the document is a file like any other.
            request.followMetalink = false
            let saved = try await f.downloader.download(request)
            #expect(saved.outcome == .downloaded)
            let same = f.dir.read("image") == document
            #expect(same, "the saved document differs")
            // Over the bound: refused in words, nothing kept.
            f.server.set("/big", Self.documentResource([UInt8](repeating: 32, count: Metalink.maxBytes + 1)))
            request.url = f.server.url("/big")
            request.followMetalink = true
            await #expect(throws: PickupError.self) { try await f.downloader.download(request) }
            #expect(!f.dir.entries.contains { $0.hasPrefix("big") }, "\(f.dir.entries)")
        }
    }
}

/// `pickup get --metalink FILE`, and `get URL` answered with a document: each file named and
/// verified as the document says.
@Suite(.serialized) struct MetalinkCLITests {
    static func sha256(_ bytes: [UInt8]) -> String {
        var hasher = AnyHasher(.sha256)
        bytes.withUnsafeBytes { hasher.update($0) }
        return Hex.encode(hasher.finalize())
    }

    @Test func filesAreNamedAndVerifiedAsTheDocumentSays() async throws {
        #expect(FileManager.default.isExecutableFile(atPath: CLI.binary), "build the pickup binary first")
        let server = try await TestServer.start()
        let dir = TempDir(), state = TempDir(), docs = TempDir()
        let a = Resource.bytes(count: 700_000, seed: 81), b = Resource.bytes(count: 90_000, seed: 82)
        server.set("/m/a.bin", Resource(body: a))
        server.set("/m/b.bin", Resource(body: b))
        // The second file's first URL (by priority) carries a query with `&`, escaped as XML wants.
        docs.write("ok.meta4", MetalinkTests.document(files: """
              <file name="first.bin"><size>\(a.count)</size><hash type="sha-256">\(Self.sha256(a))</hash>
                <url priority="2">\(server.url("/missing.bin"))</url><url priority="1">\(server.url("/m/a.bin"))</url></file>
              <file name="../second.bin"><hash type="sha-256">\(Self.sha256(b))</hash>
                <url>\(server.url("/m/b.bin"))?x=1&amp;y=2</url></file>
            """))
        let ok = try await CLI.capture(["get", "--metalink", docs.file("ok.meta4").string, "-d", dir.path.string, "-q"], state: state.path)
        #expect(ok.status == 0, "\(ok.err)")
        let firstSame = dir.read("first.bin") == a
        #expect(firstSame, "first.bin differs")
        let secondSame = dir.read(try #require(SafeFileName.sanitize("../second.bin"))) == b
        #expect(secondSame, "the second file differs")
        #expect(server.requests("/m/b.bin?x=1&y=2").count == 1, "the XML-escaped query was not sent as written")

        // A hash that does not match: verification fails (exit 5) and nothing is kept under the name.
        docs.write("bad.meta4", MetalinkTests.document(files: """
              <file name="third.bin"><hash type="sha-256">\(String(repeating: "00", count: 32))</hash>
                <url>\(server.url("/m/a.bin"))</url></file>
            """))
        let bad = try await CLI.capture(["get", "--metalink", docs.file("bad.meta4").string, "-d", dir.path.string, "-q"], state: state.path)
        #expect(bad.status == 5, "\(bad.err)")
        #expect(!dir.entries.contains("third.bin"))

        // A document that is not one: a usage error in one line.
        docs.write("no.meta4", Array("<metalink><file".utf8))
        let malformed = try await CLI.capture(["get", "--metalink", docs.file("no.meta4").string, "-d", dir.path.string], state: state.path)
        #expect(malformed.status == 2 && malformed.err.contains("Metalink"), "\(malformed.err)")
        #expect(malformed.err.split(separator: "\n").count == 1, "\(malformed.err)")
        #expect(try await CLI.run(["get", "--metalink", docs.file("ok.meta4").string, "-o", "x"], state: state.path) == 2)
        await server.stop()
    }

    @Test func aURLThatAnswersWithAMetalinkDocumentDownloadsItsFiles() async throws {
        let server = try await TestServer.start()
        let dir = TempDir(), state = TempDir()
        let a = Resource.bytes(count: 4 << 20, seed: 83)
        server.set("/m/a.bin", MirrorTests.mirror(a, etag: "\"a\"", cap: 1, rate: 2 << 20))
        server.set("/m/a2.bin", MirrorTests.mirror(a, etag: "\"a2\"", cap: 1, rate: 2 << 20))
        let document = MetalinkTests.document(files: """
              <file name="image.bin"><size>\(a.count)</size><hash type="sha-256">\(Self.sha256(a))</hash>
                <url priority="1">\(server.url("/m/a.bin"))</url><url priority="2">\(server.url("/m/a2.bin"))</url></file>
            """)
        server.set("/get/image", MetalinkAnswerTests.documentResource(document))
        let url = server.url("/get/image")
        // Into -d: named as the document says, from its mirrors; the document itself is not kept.
        let named = try await CLI.capture(["get", url, "-d", dir.path.string, "-x", "2"], state: state.path)
        #expect(named.status == 0, "\(named.err)")
        #expect(named.err.contains("is a Metalink document describing 1 file"), "\(named.err)")
        let same = dir.read("image.bin") == a
        #expect(same, "image.bin differs")
        #expect(dir.entries == ["image.bin"], "\(dir.entries)")
        #expect(!server.requests("/m/a2.bin").isEmpty, "the second mirror was not asked")
        // -o names the one file.
        let output = try await CLI.capture(["get", url, "-o", dir.file("mine.bin").string, "-q"], state: state.path)
        #expect(output.status == 0, "\(output.err)")
        let mine = dir.read("mine.bin") == a
        #expect(mine, "mine.bin differs")
        // Not followed: the document is saved as it is.
        let kept = try await CLI.capture(["get", url, "-o", dir.file("doc.meta4").string, "-q", "--no-follow-metalink"], state: state.path)
        #expect(kept.status == 0, "\(kept.err)")
        let doc = dir.read("doc.meta4") == document
        #expect(doc, "the saved document differs")
        // A document of two files cannot go to one -o: a usage error in one line, nothing written.
        server.set("/get/two", MetalinkAnswerTests.documentResource(MetalinkTests.document(files: """
              <file name="x.bin"><url>\(server.url("/m/a.bin"))</url></file><file name="y.bin"><url>\(server.url("/m/a.bin"))</url></file>
            """)))
        let two = try await CLI.capture(["get", server.url("/get/two"), "-o", dir.file("z.bin").string], state: state.path)
        #expect(two.status == 2 && two.err.contains("use -d"), "\(two.err)")
        #expect(!dir.entries.contains { $0.hasPrefix("z.bin") || $0.hasPrefix("x.bin") }, "\(dir.entries)")
        await server.stop()
    }

    @Test func aDocumentFromTheNetworkGetsNoSecretForOtherHosts() async throws {
        let server = try await TestServer.start(), other = try await TestServer.start()
        let dir = TempDir(), state = TempDir()
        let a = Resource.bytes(count: 300_000, seed: 87)
        other.set("/f.bin", Resource(body: a, etag: "\"o\""))
        server.set("/f.bin", Resource(body: a, etag: "\"s\""))
        server.set("/doc", MetalinkAnswerTests.documentResource(MetalinkTests.document(files: """
              <file name="f.bin"><url priority="1">\(other.url("/f.bin"))</url></file>
              <file name="g.bin"><url priority="1">\(server.url("/f.bin"))</url></file>
            """)))
        let r = try await CLI.capture(["get", server.url("/doc"), "-d", dir.path.string, "-q", "-H", "Authorization: Bearer s3cret",
                             "-b", "session=k3y"], state: state.path)
        #expect(r.status == 0, "\(r.err)")
        let both = dir.read("f.bin") == a && dir.read("g.bin") == a
        #expect(both, "\(dir.entries)")
        // The other host got neither; the document's own origin got both.
        #expect(!other.requests("/f.bin").isEmpty)
        #expect(other.requests("/f.bin").allSatisfy { $0.headers["authorization"] == nil && $0.headers["cookie"] == nil })
        #expect(server.requests("/f.bin").contains { $0.headers["authorization"] == "Bearer s3cret" && $0.headers["cookie"] == "session=k3y" })
        await server.stop()
        await other.stop()
    }

    @Test func anotherURLsPartialDownloadGoesWhenTheURLAnswersWithAFile() async throws {
        let server = try await TestServer.start()
        let dir = TempDir(), state = TempDir()
        let first = Resource.bytes(count: 4 << 20, seed: 85), second = Resource.bytes(count: 3 << 20, seed: 86)
        server.set("/one", Resource(body: first, etag: "\"1\"", bytesPerSecond: 512 << 10))
        server.set("/two", Resource(body: second, etag: "\"2\""))
        let out = dir.file("x.bin").string
        let killed = try await CLI.startAndKill(["get", server.url("/one"), "-o", out, "-x", "1", "-q"], state: state.path) {
            (ControlFile.load(dir.file("x.bin.pickup-ctl"))?.durableBytes ?? 0) > 512 << 10
        }
        #expect(killed)
        let r = try await CLI.capture(["get", server.url("/two"), "-o", out], state: state.path)
        #expect(r.status == 0 && r.err.contains("a partial download of another URL"), "\(r.err)")
        let same = dir.read("x.bin") == second
        #expect(same, "x.bin is not the second URL's file")
        #expect(dir.entries == ["x.bin"], "\(dir.entries)")
        await server.stop()
    }

    @Test func aKilledRunOfAURLsMetalinkResumesItsFileUnderTheSameName() async throws {
        // With -o, the document's file has the name the URL's own download would have: the rerun's
        // first request (which finds the file's partial download at its path) must not discard it.
        let server = try await TestServer.start()
        let dir = TempDir(), state = TempDir()
        let a = Resource.bytes(count: 6 << 20, seed: 84)
        server.set("/m/a.bin", MirrorTests.mirror(a, etag: "\"a\"", cap: nil, rate: 512 << 10))
        server.set("/get/image", MetalinkAnswerTests.documentResource(MetalinkTests.document(files: """
              <file name="image.bin"><size>\(a.count)</size><hash type="sha-256">\(Self.sha256(a))</hash>
                <url>\(server.url("/m/a.bin"))</url></file>
            """)))
        let args = ["get", server.url("/get/image"), "-o", dir.file("image.bin").string, "-x", "2", "-q"]
        let control = dir.file("image.bin.pickup-ctl")
        let killed = try await CLI.startAndKill(args, state: state.path) { (ControlFile.load(control)?.durableBytes ?? 0) > 1 << 20 }
        #expect(killed)
        let durable = try #require(ControlFile.load(control)).durableBytes
        let before = server.bytesSent("/m/a.bin")
        // (Paced still: a range cut short by a split then costs a chunk, not a socket buffer.)
        server.update("/m/a.bin") { $0.bytesPerSecond = 4 << 20 }
        let resumed = try await CLI.capture(Array(args.dropLast()), state: state.path)
        #expect(resumed.status == 0, "\(resumed.err)")
        let same = dir.read("image.bin") == a
        #expect(same, "image.bin differs")
        #expect(!resumed.err.contains("another URL") && resumed.err.contains("image.bin: resuming at"), "\(resumed.err)")
        let again = server.bytesSent("/m/a.bin") - before
        #expect(again <= a.count - Int(durable) + (1 << 20), "fetched \(again) of \(a.count) again, \(durable) were durable: \(resumed.err)")
        await server.stop()
    }
}
