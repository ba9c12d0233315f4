import Foundation
import SystemPackage
import Testing

@testable import Pickup

/// The control file's state machine, driven without sockets or files.
@Suite struct CheckpointTests {
    static func fresh(total: Int64? = nil) -> Checkpoints {
        Checkpoints(record: ControlRecord(url: "http://h/f", target: nil, validators: nil, totalLength: total,
                                          segments: [SegmentRecord(start: 0, end: total, done: 0)], epoch: 7))
    }

    static let strong = Validators(etag: "\"v1\"", lastModified: nil, date: nil)

    @Test func aLargeFreshDownloadStoresItsDescriptionAtOnceWithoutFsync() {
        var c = Self.fresh()
        #expect(c.checkpoint(written: [:]) == .none, "nothing described, nothing written: nothing to do")
        c.update { $0.validators = Self.strong; $0.totalLength = 100 << 20; $0.segments[0].end = 100 << 20 }
        #expect(c.wantsStoreSoon)
        guard case .store(let record, let version, let durable) = c.storeNow() else {
            Issue.record("expected a store")
            return
        }
        #expect(!durable, "a record that claims no bytes needs no fsync")
        #expect(record.durableBytes == 0)
        c.stored(record, version: version)
        #expect(c.onDisk == .claimsNothing)
        #expect(!c.wantsStoreSoon)
        #expect(c.storeNow() == .none)
    }

    @Test func aSmallDownloadWritesNothingBeforeItsFirstCheckpoint() {
        var c = Self.fresh()
        c.update { $0.validators = Self.strong; $0.totalLength = 64 << 10; $0.segments[0].end = 64 << 10 }
        #expect(!c.wantsStoreSoon)
        guard case .syncAndStore(let record, let version) = c.checkpoint(written: [0: 4096]) else {
            Issue.record("expected a checkpoint")
            return
        }
        #expect(record.segments[0].done == 4096)
        #expect(c.record.segments[0].done == 0, "nothing counts as durable before the caller's fsync and store")
        c.stored(record, version: version)
        #expect(c.record.segments[0].done == 4096)
        #expect(c.onDisk == .claimsBytes)
        #expect(c.checkpoint(written: [0: 4096]) == .none, "nothing new")
    }

    @Test func checkpointsClaimOnlyWhatWasWrittenWithinEachRange() {
        var c = Self.fresh(total: 1000)
        c.update { $0.segments = [SegmentRecord(start: 0, end: 500, done: 0), SegmentRecord(start: 500, end: 1000, done: 0)] }
        // A writer seen past its lowered end claims no more than its range.
        guard case .syncAndStore(let record, let version) = c.checkpoint(written: [0: 700, 1: 100, 5: 10]) else {
            Issue.record("expected a checkpoint")
            return
        }
        #expect(record.segments.map(\.done) == [500, 100])
        // The ranges were split while the fsync ran: what it claimed still counts.
        c.update { $0.segments[1].end = 800; $0.segments.append(SegmentRecord(start: 800, end: 1000, done: 0)) }
        c.stored(record, version: version)
        #expect(c.record.segments.map(\.done) == [500, 100, 0])
        #expect(c.checkpoint(written: [:]) != .none, "the new shape is not stored yet")
    }

    @Test func restartingReplacesAClaimingFileDurablyBeforeAnyNewByte() {
        var c = Self.fresh(total: 1000)
        c.update { $0.validators = Self.strong }
        guard case .syncAndStore(let record, let version) = c.checkpoint(written: [0: 300]) else {
            Issue.record("expected a checkpoint")
            return
        }
        c.stored(record, version: version)
        let epoch = c.record.epoch
        guard case .store(let fresh, _, let durable) = c.restarted({ $0.validators = nil; $0.totalLength = nil }) else {
            Issue.record("a file that claims bytes must be replaced first")
            return
        }
        #expect(durable)
        #expect(fresh.durableBytes == 0)
        #expect(fresh.epoch != epoch, "the cursors of the old bytes never count for the new ones")
        // A checkpoint of the old representation finishing late changes nothing.
        c.stored(record, version: version)
        #expect(c.record.durableBytes == 0)
    }

    @Test func nothingIsWrittenAfterTheRunEnds() {
        var c = Self.fresh(total: 100 << 20)
        c.update { $0.validators = Self.strong }
        c.end()
        #expect(c.checkpoint(written: [0: 4096]) == .none, "a checkpoint queued before the end writes nothing after it")
        #expect(c.storeNow() == .none)
    }

    @Test func aCursorFileWithAnotherNameIsReplacedNotMapped() throws {
        let dir = TempDir()
        let handle = try DirectoryHandle.open(dir.path, create: false)
        dir.write("f.pickup-pos", [1, 2, 3])
        #expect(link(dir.file("f.pickup-pos").string, dir.file("other").string) == 0)
        #expect(CursorFile.open("f.pickup-pos", in: handle) != nil)
        var a = stat(), b = stat()
        #expect(stat(dir.file("f.pickup-pos").string, &a) == 0 && stat(dir.file("other").string, &b) == 0)
        #expect(a.st_ino != b.st_ino, "the file another name reaches is not mapped")
        #expect(dir.read("other") == [1, 2, 3])
    }

    @Test func restartingWithNothingClaimedWaitsForTheNextDescription() {
        var c = Self.fresh()
        #expect(c.restarted({ $0.totalLength = nil }) == .none)
    }

    @Test func restartingOverAFileThatClaimsNothingRewritesItsEpochAtOnce() {
        var c = Self.fresh(total: 100)
        c.loaded(ControlRecord(url: "http://h/f", target: nil, validators: Self.strong, totalLength: 100,
                               segments: [SegmentRecord(start: 0, end: 100, done: 0)], epoch: 7))
        #expect(c.onDisk == .claimsNothing)
        guard case .store(let record, _, let durable) = c.restarted({ $0.totalLength = nil }) else {
            Issue.record("the old epoch and validators would stay on disk while the cursors take the new epoch")
            return
        }
        #expect(!durable && record.epoch != 7 && record.validators == Self.strong)
    }

    @Test func aRecoveryClaimsTheWrittenRangesAfterTheCallersFsync() {
        var c = Self.fresh(total: 1000)
        // A control file as a killed run left it.
        c.loaded(ControlRecord(url: "http://h/f", target: nil, validators: Self.strong, totalLength: 1000,
                               segments: [SegmentRecord(start: 0, end: 500, done: 100), SegmentRecord(start: 500, end: 1000, done: 0)],
                               epoch: 7))
        #expect(c.onDisk == .claimsBytes)
        guard case .syncAndStore(let record, let version) = c.recovered(c.record.merging(written: [(0, 400), (500, 650), (800, 900)])) else {
            Issue.record("expected a recovery")
            return
        }
        #expect(record.durableBytes == 400 + 150 + 100)
        #expect(c.record.durableBytes == 100, "claimed only once stored")
        c.stored(record, version: version)
        #expect(c.record.durableBytes == 650)
        #expect(c.recovered(c.record.merging(written: [(0, 50)])) == .none, "nothing new")
    }

    @Test func mergingKeepsEveryHeldByteAndOnlyThose() {
        let record = ControlRecord(url: "u", target: nil, validators: nil, totalLength: 1000,
                                   segments: [SegmentRecord(start: 0, end: 500, done: 100), SegmentRecord(start: 500, end: 1000, done: 50)])
        let merged = record.merging(written: [(50, 300), (700, 760), (990, 2000), (-5, -1)])
        #expect(merged == [
            SegmentRecord(start: 0, end: 500, done: 300), SegmentRecord(start: 500, end: 700, done: 50),
            SegmentRecord(start: 700, end: 990, done: 60), SegmentRecord(start: 990, end: 1000, done: 10),
        ])
        // Every byte of the file belongs to exactly one range.
        #expect(zip(merged, merged.dropFirst()).allSatisfy { $0.end == $1.start })
        #expect(record.merging(written: []) == record.segments)
        // Unknown length: only what extends the prefix counts.
        let open = ControlRecord(url: "u", target: nil, validators: nil, totalLength: nil,
                                 segments: [SegmentRecord(start: 0, end: nil, done: 10)])
        #expect(open.merging(written: [(20, 30), (5, 20)]) == [SegmentRecord(start: 0, end: nil, done: 30)])
    }

    @Test func theCursorFileIsTrustedOnlyForItsEpochAndBoot() throws {
        let dir = TempDir()
        let handle = try DirectoryHandle.open(dir.path, create: false)
        do {
            let file = try #require(CursorFile.open("f.pickup-pos", in: handle))
            file.reset(epoch: 42)
            let a = try #require(file.slot(0, start: 0, position: 0))
            let b = try #require(file.slot(3, start: 5000, position: 5000))
            a.store(1234, ordering: .releasing)
            b.store(6000, ordering: .releasing)
            #expect(file.slot(CursorFile.slotCount, start: 0, position: 0) == nil)
        }
        // As the next run sees it: a new mapping of the same file.
        let again = try #require(CursorFile.open("f.pickup-pos", in: handle))
        let ranges = try #require(again.recovered(epoch: 42))
        #expect(ranges.map(\.start) == [0, 5000])
        #expect(ranges.map(\.end) == [1234, 6000])
        #expect(again.recovered(epoch: 43) == nil, "slots of other bytes never count")
        again.reset(epoch: 43)
        #expect(again.recovered(epoch: 43)?.isEmpty == true)
        #expect(BootID.current != nil, "this system names its boots")
    }
}
