import Crypto
import Foundation
import SystemPackage
import Testing
import TestServer
import PickupDaemon

@testable import Pickup

/// Several sources for one file: each mirror its own server (validators, connections, failures),
/// a bad one caught by length, by validators, or piece by piece.
@Suite struct MirrorTests {
    let body = Resource.bytes(count: 6 * 1024 * 1024 + 7, seed: 26)

    /// A mirror: the file with its own ETag, at most `cap` responses at once, at `rate` per connection.
    static func mirror(_ body: [UInt8], etag: String, cap: Int? = 2, rate: Int? = 4 << 20) -> Resource {
        var r = Resource(body: body, etag: etag, bytesPerSecond: rate)
        r.maxConcurrent = cap
        return r
    }

    /// Expects the file to be `body` (compared into a Bool: a failure does not print megabytes).
    static func expectFile(_ f: Fixture, is body: [UInt8], sourceLocation: SourceLocation = #_sourceLocation) {
        let same = f.dir.read("out.bin") == body
        #expect(same, "out.bin differs from the server's file", sourceLocation: sourceLocation)
    }

    static func pieces(_ body: [UInt8], length: Int) -> Metalink.Pieces {
        let hashes = stride(from: 0, to: body.count, by: length).map { a in
            Array(SHA256.hash(data: body[a..<min(body.count, a + length)]))
        }
        return Metalink.Pieces(length: Int64(length), algorithm: .sha256, hashes: hashes)
    }

    /// `body`'s piece hashes as a Metalink document's `<pieces>` element.
    static func piecesElement(_ body: [UInt8], length: Int) -> String {
        "<pieces length=\"\(length)\" type=\"sha-256\">"
            + pieces(body, length: length).hashes.map { "<hash>\(Hex.encode($0))</hash>" }.joined() + "</pieces>"
    }

    func download(_ f: Fixture, _ urls: [String], name: String = "out.bin", pieces: Metalink.Pieces? = nil,
                  checksum: ExpectedDigest? = nil) async throws(PickupError) -> DownloadResult {
        let events = f.events
        return try await f.downloader.download(
            DownloadRequest(url: urls[0], destination: .file(f.dir.file(name)), checksum: checksum,
                            mirrors: Array(urls.dropFirst()), pieces: pieces)) { events.record($0) }
    }

    /// Every `If-Range` a mirror received is its own validator.
    func ownValidatorsOnly(_ f: Fixture, _ paths: [String: String]) {
        for (path, etag) in paths {
            for r in f.server.requests(path) {
                if let ir = r.headers["if-range"] { #expect(ir == etag, "\(path) was sent \(ir)") }
            }
        }
    }

    @Test func threeCappedMirrorsShareTheFileEachWithItsOwnValidators() async throws {
        try await Fixture(connections: 6).run { f in
            let tags = ["/a": "\"a\"", "/b": "\"b\"", "/c": "\"c\""]
            for (p, t) in tags { f.server.set(p, Self.mirror(body, etag: t)) }
            _ = try await download(f, ["/a", "/b", "/c"].map(f.server.url))
            Self.expectFile(f, is: body)
            for p in tags.keys {
                #expect(f.server.requests(p).contains { $0.status == 206 && $0.bytesSent > 0 }, "\(p) sent nothing")
                // A 503 lowers the mirror's count: connections are not sent there again and again.
                #expect(f.server.requests(p).filter { $0.status == 503 }.count <= 3, "\(p) turned away again and again")
            }
            ownValidatorsOnly(f, tags)
            #expect(f.dir.entries == ["out.bin"])
        }
    }

    @Test func aDeadMirrorIsRetiredAndTheOthersFinish() async throws {
        try await Fixture(connections: 4).run { f in
            f.server.set("/a", Self.mirror(body, etag: "\"a\"", cap: nil))
            f.server.set("/b", Self.mirror(body, etag: "\"b\"", cap: nil))
            let dead = "http://127.0.0.1:1/dead.bin"
            _ = try await download(f, [f.server.url("/a"), dead, f.server.url("/b")])
            Self.expectFile(f, is: body)
            // Its connections went to the others at once (no backoff, no "retrying" notice).
            #expect(!f.events.notices.contains { $0.contains("retrying") }, "\(f.events.notices)")
        }
    }

    @Test func aMirrorBusyAtFirstIsAskedAgainNotDropped() async throws {
        // (As a server still counting a killed run's connections answers the next run.)
        try await Fixture(connections: 2).run { f in
            // (The first slow, so that the second is surely asked before the end, however loaded the machine.)
            f.server.set("/a", Self.mirror(body, etag: "\"a\"", cap: nil, rate: 512 << 10))
            var busy = Self.mirror(body, etag: "\"b\"", cap: nil)
            busy.faults = [.status(503, [:])]
            f.server.set("/b", busy)
            _ = try await download(f, ["/a", "/b"].map(f.server.url))
            Self.expectFile(f, is: body)
            let answers = f.server.requests("/b").map(\.status)
            #expect(answers.first == 503 && answers.dropFirst().contains(206), "/b answered \(answers)")
            #expect(!f.events.notices.contains { $0.contains("retired") }, "\(f.events.notices)")
        }
    }

    @Test func aMirrorAskingForTooLongAWaitIsLeftToTheOthers() async throws {
        // (A stall timeout of seconds: at the usual half second, a loaded machine's slow answer
        // retired /b for stalling before its 503s were heard.)
        try await Fixture(stall: 5, connections: 2).run { f in
            f.server.set("/a", Self.mirror(body, etag: "\"a\"", cap: nil, rate: 512 << 10))
            var slow = Self.mirror(body, etag: "\"b\"", cap: nil)
            slow.faults = Array(repeating: .status(503, ["Retry-After": "3600"]), count: 4)
            f.server.set("/b", slow)
            _ = try await download(f, ["/a", "/b"].map(f.server.url))
            Self.expectFile(f, is: body)
            #expect(f.events.notices.contains { $0.contains("/b retired") && $0.contains("retry after 3600 s") }, "\(f.events.notices)")
        }
    }

    @Test func aDeadPrimaryLeavesTheFileToItsMirrors() async throws {
        try await Fixture(connections: 4).run { f in
            f.server.set("/b", Self.mirror(body, etag: "\"b\"", cap: nil))
            f.server.set("/c", Self.mirror(body, etag: "\"c\"", cap: nil))
            _ = try await download(f, ["http://127.0.0.1:1/dead.bin", f.server.url("/b"), f.server.url("/c")])
            Self.expectFile(f, is: body)
        }
    }

    @Test func aMirrorOfAnotherLengthIsDroppedWithANotice() async throws {
        try await Fixture(connections: 4).run { f in
            f.server.set("/a", Self.mirror(body, etag: "\"a\"", cap: nil))
            f.server.set("/short", Self.mirror(Array(body.dropLast(1000)), etag: "\"s\"", cap: nil))
            f.server.set("/b", Self.mirror(body, etag: "\"b\"", cap: nil))
            _ = try await download(f, ["/a", "/short", "/b"].map(f.server.url))
            Self.expectFile(f, is: body)
            #expect(f.events.notices.contains { $0.contains("/short is not the same file as \(f.server.url("/a"))") && $0.contains("length") })
        }
    }

    @Test func aMirrorWhoseFileChangesIsNeverSplicedWithItself() async throws {
        // /b changes to other bytes of the same length (a new ETag) after its first request. Its
        // later requests carry its own ETag in If-Range (a 200 back retires it) or answer with
        // the new one (retired before a byte is written): /b's bytes in the file are one version.
        // Which one no one can tell without hashes; with piece hashes the file is exact.
        try await Fixture(connections: 4).run { f in
            f.server.set("/a", Self.mirror(body, etag: "\"a\"", cap: nil, rate: 2 << 20))
            f.server.set("/b", Self.mirror(body, etag: "\"b1\"", cap: nil, rate: 2 << 20))
            f.server.change("/b", afterRequests: 1, to: Self.mirror(Resource.bytes(count: body.count, seed: 99), etag: "\"b2\"", cap: nil))
            _ = try await download(f, ["/a", "/b"].map(f.server.url), pieces: Self.pieces(body, length: 256 * 1024))
            Self.expectFile(f, is: body)
            for r in f.server.requests("/b") {
                if let ir = r.headers["if-range"] { #expect(ir == "\"b1\"" || ir == "\"b2\"") }
            }
            #expect(f.events.notices.contains { $0.contains("/b is not the same file") || $0.contains("/b retired") || $0.contains("failed their") },
                    "\(f.events.notices)")
        }
    }

    @Test func aMirrorWithOtherBytesIsCaughtPieceByPieceAndNamed() async throws {
        try await Fixture(connections: 6).run { f in
            let pieces = Self.pieces(body, length: 256 * 1024)
            // The good ones slower than the bad one, so that it surely serves pieces even when the whole
            // suite loads the machine (it failed once in CI: the good ones had fetched everything).
            f.server.set("/a", Self.mirror(body, etag: "\"a\"", cap: 2, rate: 1 << 20))
            f.server.set("/bad", Self.mirror(Resource.bytes(count: body.count, seed: 7), etag: "\"x\"", cap: 2))
            f.server.set("/c", Self.mirror(body, etag: "\"c\"", cap: 2, rate: 1 << 20))
            let r: DownloadResult
            do { r = try await download(f, ["/a", "/bad", "/c"].map(f.server.url), pieces: pieces) } catch {
                Issue.record("\(error): \(f.events.notices)")
                throw error
            }
            Self.expectFile(f, is: body)
            #expect(r.size == Int64(body.count))
            #expect(f.events.notices.contains { $0.contains("failed their sha-256 hash") && $0.contains("/bad") })
            #expect(f.events.notices.contains { $0.contains("mirror \(f.server.url("/bad")) retired") })
        }
    }

    @Test func piecesAreCheckedAsTheyCompleteAndABadMirrorGoesBeforeTheEnd() async throws {
        // Slow enough (512 KiB/s in all) that checkpoints, and the checks after them, come mid-way,
        // even with the whole suite running at once (at 1 MiB/s a fresh checkout's loaded run saw
        // the bad mirror's two ranges end first).
        try await Fixture(connections: 4).run { f in
            f.server.set("/a", Self.mirror(body, etag: "\"a\"", cap: 2, rate: 128 << 10))
            f.server.set("/bad", Self.mirror(Resource.bytes(count: body.count, seed: 8), etag: "\"x\"", cap: 2, rate: 128 << 10))
            _ = try await download(f, ["/a", "/bad"].map(f.server.url), pieces: Self.pieces(body, length: 128 * 1024))
            Self.expectFile(f, is: body)
            let notices = f.events.notices
            let early = notices.firstIndex { $0.contains("failed their sha-256 hash") && $0.contains("once the rest is here") }
            let retired = notices.firstIndex { $0.contains("mirror \(f.server.url("/bad")) retired") }
            #expect(early != nil && retired != nil, "\(notices)")
            // Its connections stopped there (without the checks as pieces complete, its two ranges ran to their end).
            #expect(f.server.bytesSent("/bad") < body.count / 2, "\(f.server.bytesSent("/bad"))")
            // Named while the rest was coming in: before the first round's end said anything.
            let end = notices.firstIndex { $0.contains("fetching them again") && !$0.contains("once the rest") || $0.contains("fetching again the") }
            #expect(retired.map { r in end.map { r < $0 } ?? true } == true, "\(notices)")
        }
    }

    @Test func withOnlyAWholeFileHashTheBadMirrorIsFoundByRefetchingSharesNotTheFile() async throws {
        try await Fixture(connections: 6).run { f in
            // The good ones slower than the bad one, so that it surely serves pieces even when the whole
            // suite loads the machine (it failed once in CI: the good ones had fetched everything).
            f.server.set("/a", Self.mirror(body, etag: "\"a\"", cap: 2, rate: 1 << 20))
            f.server.set("/bad", Self.mirror(Resource.bytes(count: body.count, seed: 7), etag: "\"x\"", cap: 2))
            f.server.set("/c", Self.mirror(body, etag: "\"c\"", cap: 2, rate: 1 << 20))
            let checksum = ExpectedDigest(source: "the test", algorithm: .sha256, bytes: Array(SHA256.hash(data: body)))
            do { _ = try await download(f, ["/a", "/bad", "/c"].map(f.server.url), checksum: checksum) } catch {
                Issue.record("\(error): \(f.events.notices)")
            }
            Self.expectFile(f, is: body)
            #expect(f.events.notices.contains { $0.contains("mirror \(f.server.url("/bad")) retired") }, "\(f.events.notices)")
            // Shares were fetched again, not the whole file once per suspect.
            let sent = ["/a", "/bad", "/c"].map(f.server.bytesSent).reduce(0, +)
            #expect(sent < 3 * body.count, "\(sent) bytes sent for \(body.count)")
        }
    }

    @Test func oneConnectionWhoseWholeRangeIsBadFetchesItAgainFromAnotherSource() async throws {
        // One range covering the file, every piece bad: the range is cut to the same shape it had,
        // and must still count as not held.
        try await Fixture(connections: 1).run { f in
            f.server.set("/bad", Self.mirror(Resource.bytes(count: body.count, seed: 7), etag: "\"x\"", cap: nil, rate: nil))
            f.server.set("/a", Self.mirror(body, etag: "\"a\"", cap: nil, rate: nil))
            _ = try await download(f, ["/bad", "/a"].map(f.server.url), pieces: Self.pieces(body, length: 1 << 20))
            Self.expectFile(f, is: body)
            #expect(f.server.requests("/a").contains { $0.status == 206 })
        }
    }

    @Test func aHostileControlFilesWritersNeitherTrapNorCount() {
        var record = ControlRecord(url: "http://a/f", target: nil, validators: nil, totalLength: 100,
                                   segments: [SegmentRecord(start: 0, end: 100, done: 100)], mirrors: [SourceRecord(url: "http://b/f")])
        record.writers = [[0, .max, 0], [1, .max, 0], [0, 50, 1], [-5, 3, 1], [10, 20, 99], [10, 20, .min], [7], [30, 20, 0]]
        let state = RunState(record: record, minSplit: 1, sources: SourceSet(urls: ["http://a/f", "http://b/f"], connections: 2))
        #expect(state.writersByShare == [1])
        #expect(state.written(by: 1).map { [$0.start, $0.end] } == [[0, 50]])
        #expect(state.unattributed(total: 100).map { [$0.start, $0.end] } == [[50, 100]])
    }

    @Test func withoutAGoodSourceBadPiecesEndInAVerificationError() async throws {
        try await Fixture(connections: 2).run { f in
            let pieces = Self.pieces(body, length: 1 << 20)
            f.server.set("/bad", Self.mirror(Resource.bytes(count: body.count, seed: 7), etag: "\"x\"", cap: nil, rate: nil))
            f.server.set("/bad2", Self.mirror(Resource.bytes(count: body.count, seed: 8), etag: "\"y\"", cap: nil, rate: nil))
            do throws(PickupError) {
                _ = try await download(f, ["/bad", "/bad2"].map(f.server.url), pieces: pieces)
                Issue.record("bad bytes were accepted")
            } catch {
                #expect(error.category == .verification, "\(error)")
            }
            #expect(!f.dir.entries.contains("out.bin"))
        }
    }

    @Test func linkHeaderMirrorsAreUsed() async throws {
        try await Fixture(connections: 4).run { f in
            var primary = Self.mirror(body, etag: "\"a\"", cap: 1, rate: 512 << 10)
            primary.headers["Link"] = "<\(f.server.url("/b"))>; rel=duplicate; pri=1, <\(f.server.url("/c"))>; rel=duplicate; pri=2"
            f.server.set("/a", primary)
            f.server.set("/b", Self.mirror(body, etag: "\"b\"", cap: 2))
            f.server.set("/c", Self.mirror(body, etag: "\"c\"", cap: 2))
            _ = try await download(f, [f.server.url("/a")])
            Self.expectFile(f, is: body)
            #expect(f.server.requests("/b").contains { $0.status == 206 })
            #expect(f.server.requests("/c").contains { $0.status == 206 })
            ownValidatorsOnly(f, ["/a": "\"a\"", "/b": "\"b\"", "/c": "\"c\""])
        }
    }

    @Test func anInterruptedDownloadResumesFromEveryMirrorWithItsOwnValidators() async throws {
        try await Fixture(connections: 4).run { f in
            let tags = ["/a": "\"a\"", "/b": "\"b\""]
            // Slow (1 MiB/s in all): the rest takes seconds, more than the suite keeps the pool from
            // delivering the progress event that cancels.
            for (p, t) in tags { f.server.set(p, Self.mirror(body, etag: t, cap: 2, rate: 256 << 10)) }
            let urls = ["/a", "/b"].map(f.server.url)
            let request = DownloadRequest(url: urls[0], destination: .file(f.dir.file("out.bin")), mirrors: [urls[1]])
            // Cancelled from the progress handler itself: a wait on the cooperative pool, busy with the
            // rest of the suite, could see the moment only after the download had ended. Once more
            // is held than /a has sent: some came from /b, whose answer was taken (under load, a
            // cancel at a byte count alone came before it was).
            let running = LockedBox<Task<DownloadResult, any Error>?>(nil)
            let task = Task { [downloader = f.downloader, server = f.server] in
                try await downloader.download(request) {
                    if case .progress(let p) = $0, p.bytesDone > 1 << 20, p.bytesDone > Int64(server.bytesSent("/a")) {
                        running.value?.cancel()
                    }
                }
            }
            running.value = task
            let ended = await task.result
            let interrupted = if case .failure(PickupError.interrupted) = ended { true } else { false }
            #expect(interrupted, "the download ended before it was cancelled: \(ended)")
            let record = try #require(ControlFile.load("out.bin" + SafeFileName.controlSuffix,
                                                       in: DirectoryHandle.open(f.dir.path, under: nil, create: false)))
            #expect(record.validators?.etag?.headerValue == "\"a\"")
            #expect(record.mirrors?.map(\.url) == [urls[1]])
            #expect(record.mirrors?.first?.validators?.etag?.headerValue == "\"b\"")
            let before = f.server.bytesSent("/a") + f.server.bytesSent("/b")
            let asked = tags.keys.map { ($0, f.server.requests($0).count) }
            for p in tags.keys { f.server.update(p) { $0.bytesPerSecond = nil } }
            _ = try await download(f, urls)
            Self.expectFile(f, is: body)
            ownValidatorsOnly(f, tags)
            // Every range resumed from where it was, under the validators of the mirror asked.
            let rerun = asked.flatMap { p, n in f.server.requests(p).dropFirst(n).map { (p, $0) } }.filter { $0.1.status == 206 }
            let answers = asked.map { p, n in "\(p): \(f.server.requests(p).dropFirst(n).map(\.status))" }
            #expect(!rerun.isEmpty, "the second run's answers: \(answers)")
            for (p, r) in rerun { #expect(r.headers["if-range"] == tags[p], "\(p): \(r.headers["range"] ?? "")") }
            // Resumed, not fetched again: what the second run fetched is what the first did not keep.
            let after = f.server.bytesSent("/a") + f.server.bytesSent("/b")
            #expect(after - before < body.count - Int(record.durableBytes) + (4 << 20))
        }
    }

    @Test func theManagerKeepsMirrorsAndPiecesAcrossARestart() async throws {
        try await ManagerFixture().run { f in
            for (p, t) in ["/a": "\"a\"", "/b": "\"b\""] { f.server.set(p, Self.mirror(body, etag: t, cap: 2, rate: 1 << 20)) }
            f.server.set("/bad", Self.mirror(Resource.bytes(count: body.count, seed: 5), etag: "\"x\"", cap: 2, rate: 1 << 20))
            var config = f.configuration()
            config.engine.connections = 6
            let pieces = Self.pieces(body, length: 512 * 1024)
            let item = NewDownload(url: f.server.url("/a"), to: .file(f.dir.file("out.bin")),
                                   mirrors: ["/bad", "/b"].map(f.server.url), pieces: pieces)
            let first = try DownloadManager(configuration: config)
            let id = try await first.add([item])[0]
            await first.waitUntil { ($0[id]?.progress.bytesDone ?? 0) > 1 << 20 }
            await first.shutdown()
            for p in ["/a", "/b", "/bad"] { f.server.update(p) { $0.bytesPerSecond = nil } }
            let second = try DownloadManager(configuration: config)
            let info = try #require(await second.download(id))
            #expect(info.mirrors == ["/bad", "/b"].map(f.server.url))
            #expect(info.pieces == pieces)
            await second.waitUntilAll(.completed)
            let same = f.dir.read("out.bin") == body
            #expect(same, "the file differs")
            await second.shutdown()
        }
    }

    @Test func theAPITakesURLsAsMirrorsAndShowsThemWithoutCredentials() async throws {
        try await DaemonFixture { $0.engine.connections = 4 }.run { f in
            f.server.set("/a.bin", Self.mirror(body, etag: "\"a\"", cap: 2, rate: 512 << 10))
            f.server.set("/b.bin", Self.mirror(body, etag: "\"b\"", cap: 2))
            let secret = f.server.url("/b.bin").replacingOccurrences(of: "http://", with: "http://u:hunter2@")
            let added = try await f.client.add(APIAddRequest(url: f.server.url("/a.bin"), name: "m.bin", urls: [secret]))
            #expect(added.mirrors == [f.server.url("/b.bin").replacingOccurrences(of: "http://", with: "http://***@")])
            _ = try await f.waitUntil { $0[added.id]?.state == "completed" }
            let same = f.root.read("m.bin") == body
            #expect(same, "the file differs")
            // The mirror's own credentials went to it, and to no one else.
            #expect(f.server.requests("/b.bin").contains { $0.headers["authorization"] != nil })
            #expect(!f.server.requests("/a.bin").contains { $0.headers["authorization"] != nil })
            // Only "urls": the first is the URL.
            let body2 = try JSONDecoder().decode(APIAddRequest.self, from: Data(#"{"urls":["http://x/1","http://y/1"]}"#.utf8))
            #expect(body2.url == "http://x/1" && body2.urls == ["http://y/1"])
        }
    }

    @Test func inputListLinesTakeTabSeparatedMirrors() throws {
        let list = try InputList(parsing: "https://a.example/f.iso\thttps://b.example/f.iso\tftp://c.example/f.iso out=f.iso\n")
        #expect(list.entries.count == 1)
        #expect(list.entries[0].url == "https://a.example/f.iso")
        #expect(list.entries[0].mirrors == ["https://b.example/f.iso", "ftp://c.example/f.iso"])
        #expect(list.entries[0].name == "f.iso")
        #expect(throws: PickupError.self) { try InputList(parsing: "https://a.example/f\tnot-a-url\n") }
        #expect(throws: PickupError.self) { try InputList(parsing: "https://a.example/f\tfile:///etc/passwd\n") }
    }

    @Test func sourceSetSpreadsConnectionsAndRetiresOnlyWhileAnotherIsLive() {
        var s = SourceSet(urls: ["a", "b", "c"], connections: 8)
        s.bind(0, to: 0)
        #expect(s.bind(1) == 1)
        #expect(s.bind(2) == 2)
        #expect(s.bind(3) == 0)
        // A busy source takes no more than it had without the refused connection.
        #expect(s.busy(0, connection: 3, othersFetching: true, why: "503").next == .moveTo(1))
        #expect(s.sources[0].cap == 1)
        #expect(s.pick(avoiding: nil) != 0)
        #expect(s.retire(1, why: "x") != nil)
        #expect(s.retire(2, why: "x") != nil)
        #expect(s.retire(0, why: "x") == nil, "the last live source is never retired")
        // A lone connection turned away waits and asks again; turned away again, it has failed.
        var u = SourceSet(urls: ["a", "b"], connections: 2)
        u.bind(0, to: 0)
        u.bind(1, to: 1)
        #expect(u.busy(1, connection: 1, othersFetching: true, why: "503").next == .retry)
        u.measured(0, bytes: 10, seconds: 1)
        let again = u.busy(1, connection: 1, othersFetching: true, why: "503")
        #expect(again.next == .moveTo(0) && again.retired != nil)
        // The endgame: a range stalled on one source is taken over from another with room.
        var e = SourceSet(urls: ["a", "b"], connections: 4)
        e.bind(0, to: 0)
        e.bind(1, to: 0)
        #expect(e.takeOver(1, from: 0) == 1 && e.source(of: 1) == 1)
        #expect(e.takeOver(1, from: 0) == nil, "already on another source")
        // A source that sent bad pieces is avoided while a clean one has room.
        var t = SourceSet(urls: ["a", "b"], connections: 2)
        _ = t.badPiece(0)
        #expect(t.pick() == 1)
    }

    /// A mirror that answered two at once and turns one away while one runs (still counting a
    /// connection just closed) keeps its cap of two; over what it answered, it takes what runs.
    @Test func aBusyAnswerNeverLowersAMirrorsCapBelowWhatItAnswered() {
        var s = SourceSet(urls: ["a", "b"], connections: 8)
        s.bind(0, to: 0)
        s.bind(1, to: 0)
        s.bind(2, to: 0)
        s.accepted(0, connection: 0)
        s.accepted(0, connection: 1)
        #expect(s.sources[0].proven == 2, "bound but not yet answered does not count")
        #expect(s.busy(0, connection: 2, othersFetching: true, why: "503").next == .moveTo(1))
        #expect(s.sources[0].cap == 2)
        s.unbind(1)  // its range was cut: it asks again, and is turned away while 0 runs
        s.bind(1, to: 0)
        _ = s.busy(0, connection: 1, othersFetching: true, why: "503")
        #expect(s.sources[0].cap == 2, "a refusal below what it answered keeps the cap")
        // One that never answered two at once takes what runs.
        var t = SourceSet(urls: ["a", "b"], connections: 8)
        t.bind(0, to: 0)
        t.accepted(0, connection: 0)
        t.bind(1, to: 0)
        _ = t.busy(0, connection: 1, othersFetching: true, why: "503")
        #expect(t.sources[0].cap == 1)
    }
}

/// The `pickup` binary with several sources: URLs on the command line, tab-separated in `-i`,
/// a Metalink file with a bad mirror, and a SIGKILL in the middle.
@Suite(.serialized) struct MirrorCLITests {
    let body = Resource.bytes(count: 8 * 1024 * 1024 + 3, seed: 261)

    @Test func severalURLsAreMirrorsAndAKillResumesFromAllOfThem() async throws {
        let server = try await TestServer.start()
        let dir = TempDir(), state = TempDir()
        for (p, t) in ["/a": "\"a\"", "/b": "\"b\"", "/c": "\"c\""] {
            // Slow enough that the kill lands before the end even when the poll is slow under load.
            server.set(p, MirrorTests.mirror(body, etag: t, cap: 2, rate: 192 * 1024))
        }
        let args = ["get"] + ["/a", "/b", "/c"].map(server.url) + ["-o", dir.file("out.bin").string, "-x", "6", "-q"]
        let part = dir.file("out.bin.pickup-part")
        let killed = try await CLI.startAndKill(args, state: state.path) {
            (ControlFile.load(dir.file("out.bin.pickup-ctl"))?.durableBytes ?? 0) > 1 << 20
        }
        #expect(killed)
        let record = try #require(ControlFile.load(dir.file("out.bin.pickup-ctl")))
        #expect(record.mirrors?.count == 2)
        #expect(FS.size(part) != nil)
        let paths = ["/a", "/b", "/c"]
        let asked = paths.map { server.requests($0).count }
        for p in paths { server.update(p) { $0.bytesPerSecond = 4 << 20 } }
        let resumed = try await CLI.capture(args, state: state.path)
        #expect(resumed.status == 0, "\(resumed.err)")
        let same = dir.read("out.bin") == body
        #expect(same, "the file differs")
        // The second run asked every mirror, and no byte the control file held durable.
        let durable = record.segments.map { $0.start..<($0.start + $0.done) }
        for (p, n) in zip(paths, asked) {
            let rerun = server.requests(p).dropFirst(n).filter { $0.status == 206 }
            #expect(!rerun.isEmpty, "\(p) was not asked again: \(server.requests(p).dropFirst(n).map(\.status)) \(resumed.err)")
            for r in rerun {
                let first = r.headers["range"].flatMap { $0.dropFirst(6).split(separator: "-").first }.flatMap { Int64($0) }
                #expect(first.map { f in !durable.contains { $0.contains(f) } } == true, "\(p) asked \(r.headers["range"] ?? "") again")
            }
        }
        await server.stop()
    }

    @Test func inputListTabsAndAMetalinkBadMirror() async throws {
        let server = try await TestServer.start()
        let dir = TempDir(), state = TempDir(), docs = TempDir()
        server.set("/a/f.bin", MirrorTests.mirror(body, etag: "\"a\"", cap: 2, rate: 512 << 10))
        server.set("/b/f.bin", MirrorTests.mirror(body, etag: "\"b\"", cap: 2))
        server.set("/bad/f.bin", MirrorTests.mirror(Resource.bytes(count: body.count, seed: 3), etag: "\"x\"", cap: 2))
        docs.write("list.txt", Array("\(server.url("/a/f.bin"))\t\(server.url("/b/f.bin")) out=listed.bin\n".utf8))
        let listed = try await CLI.capture(["get", "-i", docs.file("list.txt").string, "-d", dir.path.string, "-x", "4", "-q"], state: state.path)
        #expect(listed.status == 0, "\(listed.err)")
        let listedSame = dir.read("listed.bin") == body
        #expect(listedSame, "the file differs")
        #expect(server.requests("/b/f.bin").contains { $0.status == 206 })

        docs.write("m.meta4", MetalinkTests.document(files: """
              <file name="meta.bin"><size>\(body.count)</size><hash type="sha-256">\(MetalinkCLITests.sha256(body))</hash>
                \(MirrorTests.piecesElement(body, length: 1 << 20))
                <url priority="1">\(server.url("/a/f.bin"))</url><url priority="2">\(server.url("/bad/f.bin"))</url>
                <url priority="3">\(server.url("/b/f.bin"))</url></file>
            """))
        let meta = try await CLI.capture(["get", "--metalink", docs.file("m.meta4").string, "-d", dir.path.string, "-x", "6"], state: state.path)
        #expect(meta.status == 0, "\(meta.err)")
        let metaSame = dir.read("meta.bin") == body
        #expect(metaSame, "the file differs")
        #expect(server.requests("/bad/f.bin").contains { $0.status == 206 }, "the bad mirror was not asked")
        await server.stop()
    }
}
