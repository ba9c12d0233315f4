import Foundation
import SystemPackage
import Testing
import TestServer

@testable import Pickup

/// ``Recovery``'s rules, without files.
@Suite struct RecoveryRuleTests {
    static let strong = Validators(etag: EntityTag("\"a\""), lastModified: nil, lastModifiedIsStrong: false)

    static func record(validators: Validators?, segments: [SegmentRecord], total: Int64? = 1000) -> ControlRecord {
        ControlRecord(url: "http://h/f", target: nil, validators: validators, totalLength: total, segments: segments, epoch: 1)
    }

    /// What a resumed run says: how much, in how many ranges, how much the cursors added.
    @Test func aResumedRunSaysWhatItHolds() {
        let one = Self.record(validators: Self.strong, segments: [SegmentRecord(start: 0, end: 1000, done: 600)])
        #expect(Recovery.resuming(one, durable: 600) == "resuming at 600 B of 1000 B")
        #expect(Recovery.resuming(one, durable: 400) == "resuming at 600 B of 1000 B (200 B of it written since the last checkpoint)")
        let two = Self.record(validators: Self.strong, segments: [SegmentRecord(start: 0, end: 500, done: 100),
                                                                   SegmentRecord(start: 500, end: 1000, done: 200)])
        #expect(Recovery.resuming(two, durable: 300) == "resuming at 300 B of 1000 B in 2 ranges")
        let unknown = Self.record(validators: Self.strong, segments: [SegmentRecord(start: 0, end: nil, done: 10)], total: nil)
        #expect(Recovery.resuming(unknown, durable: 10) == "resuming at 10 B")
        #expect(Recovery.resuming(Self.record(validators: Self.strong, segments: [SegmentRecord(start: 0, end: 1000, done: 0)]), durable: 0) == nil)
    }

    @Test func cursorsWithoutAStrongValidatorAreNeverTakenBack() {
        // The splice: a control file that claims nothing (written before the first checkpoint) and
        // cursors that vouch for bytes, of a server with no validator.
        let r = Self.record(validators: nil, segments: [SegmentRecord(start: 0, end: 1000, done: 0)])
        let found = Recovery.Found(record: r, controlExists: true, partialSize: 600, written: [(0, 600)])
        guard case .startOver(let why) = Recovery.decide(found, url: "http://h/f") else {
            Issue.record("bytes of a representation without a validator were kept across runs")
            return
        }
        #expect(why.contains("no strong validator"))
        let weak = Validators(etag: EntityTag("W/\"a\""), lastModified: nil, lastModifiedIsStrong: false)
        let w = Recovery.Found(record: Self.record(validators: weak, segments: r.segments), controlExists: true,
                               partialSize: 600, written: [(0, 600)])
        #expect(Recovery.decide(w, url: "http://h/f") != .resume(Self.record(validators: weak, segments: r.segments), merged: [SegmentRecord(start: 0, end: 1000, done: 600)]))
        if case .resume = Recovery.decide(w, url: "http://h/f") { Issue.record("a weak ETag resumed across runs") }
    }

    /// Numbers past their range in a control file (its checksum right: written by hand or by
    /// another program) start over instead of reaching arithmetic that traps.
    @Test func aControlFileWithNumbersPastTheirRangeStartsOver() {
        let hostile: [[SegmentRecord]] = [
            [SegmentRecord(start: Int64.max - 1, end: nil, done: 5)],  // start + done overflows
            [SegmentRecord(start: 0, end: Int64.min, done: 0)],  // end - next would overflow
            [SegmentRecord(start: 0, end: nil, done: Int64.max / 2 + 1), SegmentRecord(start: 1, end: nil, done: Int64.max / 2 + 1)],  // the sum overflows
            [SegmentRecord(start: -1, end: 10, done: 0)],
        ]
        for segments in hostile {
            let found = Recovery.Found(record: Self.record(validators: Self.strong, segments: segments), controlExists: true,
                                       partialSize: Int64.max, written: nil)
            guard case .startOver = Recovery.decide(found, url: "http://h/f") else {
                Issue.record("kept: \(segments)")
                continue
            }
        }
        let negative = Recovery.Found(record: Self.record(validators: Self.strong, segments: [SegmentRecord(start: 0, end: nil, done: 0)], total: -5),
                                      controlExists: true, partialSize: 0, written: nil)
        if case .resume = Recovery.decide(negative, url: "http://h/f") { Issue.record("a negative length was kept") }
    }

    @Test func aCompleteFileIsConfirmedBeforeItIsPutInPlace() {
        // Without a validator nothing can confirm it: fetched again.
        let r = Self.record(validators: nil, segments: [SegmentRecord(start: 0, end: 1000, done: 1000)])
        let found = Recovery.Found(record: r, controlExists: true, partialSize: 1000, written: nil)
        if case .resume = Recovery.decide(found, url: "http://h/f") { Issue.record("a complete file was kept unconfirmed") }
        // With one, its last byte is asked again (with If-Range).
        let s = Self.record(validators: Self.strong, segments: [SegmentRecord(start: 0, end: 500, done: 500), SegmentRecord(start: 500, end: 1000, done: 300)])
        let complete = Recovery.Found(record: s, controlExists: true, partialSize: 1000, written: [(500, 1000)])
        #expect(Recovery.decide(complete, url: "http://h/f") == .resume(s, merged: [SegmentRecord(start: 0, end: 1000, done: 999)]))
    }

    /// A record that holds no byte (killed before a checkpoint claimed any, with no cursor to add)
    /// keeps the download's own facts, not what it said of the file: a new version's first answer
    /// at byte 0 carries no If-Range, and kept, the old validators would have been recorded for its
    /// bytes. (Torture seed 182103022101: a weak ETag, the file changed, every rerun fetched it again.)
    @Test func aRecordThatHoldsNothingKeepsOnlyTheDownloadsOwnFacts() {
        let weak = Validators(etag: EntityTag("W/\"a\""), lastModified: nil, lastModifiedIsStrong: false)
        for validators in [weak, Self.strong] {
            var r = Self.record(validators: validators, segments: [SegmentRecord(start: 0, end: 500, done: 0), SegmentRecord(start: 500, end: 1000, done: 0)])
            r.target = "/d/f (1).bin"
            r.serverDigest = ExpectedDigest(source: "the server", algorithm: .sha256, bytes: Array(repeating: 1, count: 32))
            r.mirrors = [SourceRecord(url: "http://m/f", validators: validators, rejected: "its length differs")]
            r.writers = [[0, 10, 1]]
            r.rangesServed = true
            let found = Recovery.Found(record: r, controlExists: true, partialSize: 0, written: nil)
            guard case .resume(let kept, nil) = Recovery.decide(found, url: "http://h/f") else {
                Issue.record("a record holding nothing was not taken as it is: \(Recovery.decide(found, url: "http://h/f"))"); continue
            }
            #expect(kept.url == r.url && kept.target == r.target && kept.epoch == r.epoch)
            #expect(kept.validators == nil && kept.totalLength == nil && kept.serverDigest == nil && kept.writers == nil && kept.rangesServed == nil)
            #expect(kept.segments == [SegmentRecord(start: 0, end: nil, done: 0)])
            #expect(kept.mirrors == [SourceRecord(url: "http://m/f", validators: nil, rejected: "its length differs")])
        }
    }

    @Test func rangesThatClaimNothingNeedNoBytesInThePartialFile() {
        // Eight ranges planned, none checkpointed, the file not preallocated: nothing is missing.
        let segments = (0..<8).map { SegmentRecord(start: Int64($0) * 125, end: Int64($0 + 1) * 125, done: 0) }
        let r = Self.record(validators: Self.strong, segments: segments)
        let found = Recovery.Found(record: r, controlExists: true, partialSize: 300, written: [(0, 300), (125, 140)])
        guard case .resume(_, let merged?) = Recovery.decide(found, url: "http://h/f") else {
            Issue.record("a download whose ranges claim nothing was started over")
            return
        }
        #expect(merged.reduce(0) { $0 + $1.done } == 300)
        // A claim past the file's end is not.
        var claiming = segments
        claiming[7].done = 10
        let short = Recovery.Found(record: Self.record(validators: Self.strong, segments: claiming), controlExists: true,
                                   partialSize: 300, written: nil)
        #expect(Recovery.decide(short, url: "http://h/f") == .startOver("the partial file is missing or shorter than recorded; starting over"))
    }

    @Test func cursorsPastTheFileAreIgnoredAndOtherFindingsDecided() {
        let r = Self.record(validators: Self.strong, segments: [SegmentRecord(start: 0, end: 1000, done: 100)])
        let past = Recovery.Found(record: r, controlExists: true, partialSize: 200, written: [(0, 500)])
        #expect(Recovery.decide(past, url: "http://h/f") == .resume(r, merged: nil))
        #expect(Recovery.decide(.init(record: nil, controlExists: false, partialSize: 0, written: nil), url: "u") == .fresh)
        if case .startOver = Recovery.decide(.init(record: nil, controlExists: true, partialSize: 0, written: nil), url: "u") {} else {
            Issue.record("a damaged control file was trusted")
        }
        if case .startOver = Recovery.decide(.init(record: nil, controlExists: false, partialSize: 5, written: nil), url: "u") {} else {
            Issue.record("a partial file without a control file was trusted")
        }
        if case .anotherURL = Recovery.decide(.init(record: r, controlExists: true, partialSize: 200, written: nil), url: "http://other/f") {} else {
            Issue.record("a control file of another URL was trusted")
        }
    }
}

/// The findings of the recovery review, each against a real `pickup` process.
@Suite(.serialized) struct RecoveryProcessTests {
    /// No ETag, no Last-Modified; killed before the first checkpoint; the file changes (same
    /// size): the rerun must not combine the old bytes the cursors vouch for with new ones.
    @Test func cursorsOfAServerWithoutValidatorsAreNotSplicedWithANewVersion() async throws {
        let server = try await TestServer.start()
        let size = 8 * 1024 * 1024
        let old = Resource.bytes(count: size, seed: 1), new = Resource.bytes(count: size, seed: 2)
        // 600,000 bytes, then nothing: the run waits (its stall timeout is ten minutes, and its
        // checkpoints too) until the test kills it, however loaded the machine.
        server.set("/n.bin", Resource(body: old, etag: nil, faults: [.stallAfter(600_000)]))
        let dir = TempDir(), state = TempDir()
        let out = dir.file("n.bin")
        let args = ["get", server.url("/n.bin"), "-o", out.string, "-q", "-x", "1", "--stall-timeout", "600"]
        let p = try await CLI.start(args, state: state.path, environment: ["PICKUP_TEST_CHECKPOINT_INTERVAL": "600"])
        defer { p.kill() }
        // Killed once the 600,000 bytes are written (the cursor's store follows each write), before
        // any checkpoint.
        let partial = FilePath(out.string + SafeFileName.partialSuffix)
        #expect(await eventually { (FS.size(partial) ?? 0) >= 600_000 || !p.isRunning })
        #expect(p.isRunning)
        p.signal(SIGKILL)
        _ = await eventually { !p.isRunning }
        #expect(ControlFile.load(FilePath(out.string + SafeFileName.controlSuffix))?.durableBytes ?? 0 == 0, "a checkpoint came first")
        #expect(heldAfterKill(out).written > 0, "the cursors vouch for bytes (else this tests nothing)")
        server.set("/n.bin", Resource(body: new, etag: nil))
        let first = server.requests("/n.bin").count
        #expect(try await CLI.run(args, state: state.path) == 0)
        let same = dir.read("n.bin") == new
        #expect(same, "old and new bytes were combined")
        #expect(server.requests("/n.bin").dropFirst(first).allSatisfy { $0.headers["range"]?.hasPrefix("bytes=0-") != false })
        await server.stop()
    }

    /// Last-Modified only, 8 connections, killed while its connections are opening (ranges
    /// planned, none checkpointed, the file not preallocated): the rerun resumes.
    @Test func aKillWhileConnectionsOpenDoesNotStartOver() async throws {
        let server = try await TestServer.start()
        let size = 16 * 1024 * 1024
        let body = Resource.bytes(count: size, seed: 3)
        var r = Resource(body: body, etag: nil, bytesPerSecond: 256 * 1024)
        r.lastModified = "Sun, 22 Nov 2026 08:00:00 GMT"
        server.set("/m.bin", r)
        let dir = TempDir(), state = TempDir()
        let out = dir.file("m.bin")
        let args = ["get", server.url("/m.bin"), "-o", out.string, "-q", "-x", "8"]
        #expect(try await CLI.startAndKill(args, state: state.path) { server.requests("/m.bin").count >= 4 })
        let held = heldAfterKill(out)
        let sent = Int64(server.bytesSent("/m.bin"))
        // Paced, so that what a connection has in flight when its range is cut is one chunk (at
        // full speed on loopback the server pushes megabytes into a socket before it is closed).
        server.update("/m.bin") { $0.bytesPerSecond = 4 * 1024 * 1024 }
        let first = server.requests("/m.bin").count
        let rerun = try await CLI.capture(args.filter { $0 != "-q" }, state: state.path)
        #expect(rerun.status == 0)
        #expect(!rerun.err.contains("starting over"), "the rerun started over: \(rerun.err)")
        let same = dir.read("m.bin") == body
        #expect(same)
        let requests = server.requests("/m.bin").dropFirst(first)
        let again = Int64(requests.reduce(0) { $0 + $1.bytesSent })
        if again > Int64(size) - held.written + 8 * 2 * 65536 {
            print("rerun requests: " + requests.map { "\($0.headers["range"] ?? "-") \($0.status) \($0.bytesSent)" }.joined(separator: ", "))
        }
        #expect(again <= Int64(size) - held.written + 8 * 2 * 65536, "the rerun fetched \(again) of \(size) bytes (\(held.written) held, \(sent) sent before)")
        await server.stop()
    }

    /// An fsync that fails (EIO) ends the run with exit 6: the kernel may have dropped the bytes it
    /// could not write, so nothing written since is ever claimed, however later fsyncs answer.
    @Test func aFailedFsyncEndsTheRunAndNothingSinceIsClaimed() async throws {
        let server = try await TestServer.start()
        let body = Resource.bytes(count: 6 * 1024 * 1024, seed: 8)
        server.set("/e.bin", Resource(body: body, bytesPerSecond: 2 * 1024 * 1024))
        let dir = TempDir(), state = TempDir()
        let out = dir.file("e.bin")
        let args = ["get", server.url("/e.bin"), "-o", out.string, "-q", "-x", "1"]
        // The first checkpoint's fsync succeeds, the second fails, later ones would succeed.
        #expect(try await CLI.run(args, state: state.path, environment: ["PICKUP_TEST_FAULTS": "sync=EIO@1"]) == 6)
        let record = ControlFile.load(FilePath(out.string + SafeFileName.controlSuffix))
        let claimed = record?.durableBytes ?? 0
        #expect(claimed < Int64(body.count), "a run whose fsync failed claimed every byte")
        server.update("/e.bin") { $0.bytesPerSecond = nil }
        #expect(try await CLI.run(args, state: state.path) == 0)
        let same = dir.read("e.bin") == body
        #expect(same)
        await server.stop()
    }

    /// A file that changed after it was finished is saved once beside the old one, not once per rerun.
    @Test func aChangedFileIsSavedOnceNotOncePerRerun() async throws {
        let server = try await TestServer.start()
        let v1 = Resource.bytes(count: 100_000, seed: 4), v2 = Resource.bytes(count: 100_000, seed: 5)
        server.set("/c.bin", Resource(body: v1, etag: "\"1\""))
        let dir = TempDir(), state = TempDir()
        let args = ["get", server.url("/c.bin"), "-o", dir.file("out.bin").string, "-q"]
        #expect(try await CLI.run(args, state: state.path) == 0)
        server.set("/c.bin", Resource(body: v2, etag: "\"2\""))
        for _ in 0..<3 { #expect(try await CLI.run(args, state: state.path) == 0) }
        #expect(dir.entries == ["out (1).bin", "out.bin"])
        let (first, second) = (dir.read("out.bin") == v1, dir.read("out (1).bin") == v2)
        #expect(first && second)
        // Without the index (another state directory), the numbered file's own record says so.
        let other = TempDir()
        #expect(try await CLI.run(args, state: other.path) == 0)
        #expect(dir.entries == ["out (1).bin", "out.bin"])
        await server.stop()
    }
}

/// A full disk and a cursor file cut short never end the process with a signal.
@Suite(.serialized, .enabled(if: getuid() == 0, "mounting a small tmpfs needs root"))
struct MappedFileTests {
    @Test func aCompletelyFullDiskExitsSixNotSIGBUS() async throws {
        let disk = try #require(SmallDisk(megabytes: 8), "mounting a small tmpfs failed")
        // Fill it to the last block.
        let filler = disk.path.appending("filler").string
        let fd = open(filler, O_WRONLY | O_CREAT, 0o600)
        #expect(fd >= 0)
        var block = [UInt8](repeating: 7, count: 4096)
        while block.withUnsafeMutableBytes({ write(fd, $0.baseAddress, 4096) }) > 0 {}
        close(fd)
        let server = try await TestServer.start()
        let body = Resource.bytes(count: 3 * 1024 * 1024, seed: 6)
        server.set("/full.bin", Resource(body: body, bytesPerSecond: 4 * 1024 * 1024))
        let state = TempDir()
        let p = try await CLI.start(["get", server.url("/full.bin"), "-o", disk.path.appending("full.bin").string, "-q"], state: state.path)
        defer { p.kill() }
        #expect(await eventually(seconds: 120) { !p.isRunning })
        let status = await p.wait()
        #expect(status.exited, "\(status)")
        #expect(status == .exited(6))
        // With room again, the same command finishes.
        #expect(unlink(filler) == 0)
        #expect(try await CLI.run(["get", server.url("/full.bin"), "-o", disk.path.appending("full.bin").string, "-q"], state: state.path) == 0)
        let same = FileManager.default.contents(atPath: disk.path.appending("full.bin").string).map(Array.init) == body
        #expect(same)
        await server.stop()
    }

    @Test func aCursorFileCutShortWhileMappedEndsNoProcess() async throws {
        let server = try await TestServer.start()
        let body = Resource.bytes(count: 6 * 1024 * 1024, seed: 7)
        // The first answer stops after 600,000 bytes: the run waits there (whatever the machine's
        // load) while the test cuts the cursor file, then its stall timeout (2 s) retries and the
        // rest is written through the mapping of a file that is now empty.
        server.set("/cut.bin", Resource(body: body, faults: [.stallAfter(600_000)]))
        let dir = TempDir(), state = TempDir()
        let out = dir.file("cut.bin")
        let cursor = out.string + SafeFileName.cursorSuffix
        let p = try await CLI.start(["get", server.url("/cut.bin"), "-o", out.string, "-q", "-x", "1", "--stall-timeout", "2"],
                              state: state.path)
        defer { p.kill() }
        let partial = FilePath(out.string + SafeFileName.partialSuffix)
        #expect(await eventually { FS.size(FilePath(cursor)) == Int64(CursorFile.byteCount) && (FS.size(partial) ?? 0) >= 600_000 })
        #expect(truncate(cursor, 0) == 0)
        #expect(await eventually(seconds: 120) { !p.isRunning })
        let status = await p.wait()
        #expect(status.exited, "\(status)")
        #expect(status == .exited(0))
        let same = dir.read("cut.bin") == body
        #expect(same)
        await server.stop()
    }
}
