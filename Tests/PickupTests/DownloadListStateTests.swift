import Foundation
import Observation
import SystemPackage
import Testing

@testable import Pickup

/// The list a UI shows (``DownloadListState``), explored with seeded random event sequences as a
/// manager sends them: it always equals a plain model of the events, and what each event is said
/// to change is what changed (a row where one download changed, the list where one came or went).
@Suite struct DownloadListStateTests {
    static func info(_ id: Int64, _ state: DownloadState, bytes: Int64 = 0) -> DownloadInfo {
        DownloadInfo(id: DownloadID(rawValue: id), url: "https://example.com/\(id)", destination: .directory(FilePath("/d")), state: state,
                     priority: 0, progress: DownloadProgress(bytesDone: bytes, totalBytes: 1000, bytesPerSecond: 0), path: nil,
                     failure: nil, speedLimit: nil, checksum: nil, overwrite: false, connections: nil,
                     addedAt: Date(timeIntervalSince1970: 0), finishedAt: nil)
    }

    @Test func eventSequencesFoldIntoWhatTheyDescribeAndSayWhatChanged() {
        let seed = propertySeed("PICKUP_LISTSTATE_SEED", "DownloadListStateTests")
        var random = SplitMix(state: seed)
        let states: [DownloadState] = [.waiting, .running, .paused, .completed, .failed]
        for trial in 0..<200 {
            var list = DownloadListState()
            var model: [Int64: DownloadInfo] = [:]  // what the events describe
            var nextID: Int64 = 1
            for step in 0..<60 {
                let before = list.downloads
                let known = model.keys.sorted()
                let pick = known.isEmpty ? nil : known[Int(random.next() % UInt64(known.count))]
                let stranger = Int64(10_000 + Int(random.next() % 5))  // never added: ignored
                let event: ManagerEvent
                switch random.next() % 8 {
                case 0:
                    let all = (0..<Int(random.next() % 4)).map { _ -> DownloadInfo in
                        defer { nextID += 1 }
                        return Self.info(nextID, states[Int(random.next() % 5)])
                    }
                    model = Dictionary(uniqueKeysWithValues: all.map { ($0.id.rawValue, $0) })
                    event = .snapshot(all.shuffled(using: &random), ManagerTotals())
                case 1, 2:
                    model[nextID] = Self.info(nextID, .waiting)
                    event = .added(Self.info(nextID, .waiting))
                    nextID += 1
                case 3:
                    let id = pick ?? stranger
                    let changed = Self.info(id, states[Int(random.next() % 5)], bytes: Int64(random.next() % 1000))
                    if model[id] != nil { model[id] = changed }
                    event = .changed(changed)
                case 4:
                    let id = pick ?? stranger
                    let p = DownloadProgress(bytesDone: Int64(random.next() % 1000), totalBytes: 1000, bytesPerSecond: 5)
                    model[id]?.progress = p
                    event = .progress(DownloadID(rawValue: id), p)
                case 5:
                    let id = random.next() % 3 == 0 ? stranger : (pick ?? stranger)
                    model[id] = nil
                    event = .removed(DownloadID(rawValue: id))
                case 6:
                    event = .totals(ManagerTotals(bytesDone: Int64(random.next() % 100)))
                default:
                    event = .notice(DownloadID(rawValue: pick ?? stranger), "note")
                }
                let change = list.apply(event)
                let where_ = "seed \(seed) trial \(trial) step \(step): \(event)"
                // Equal to the model, in the order the downloads were added (ids grow).
                #expect(list.downloads == model.keys.sorted().map { model[$0]! }, "\(where_)")
                for id in model.keys { #expect(list[DownloadID(rawValue: id)] == model[id], "\(where_)") }
                #expect(list[DownloadID(rawValue: stranger)] == nil, "\(where_)")
                // What it said changed is what changed.
                switch change {
                case .none:
                    #expect(list.downloads == before, "\(where_)")
                case .row(let i):
                    #expect(list.downloads.map(\.id) == before.map(\.id), "\(where_)")
                    for j in before.indices where j != i { #expect(list.downloads[j] == before[j], "\(where_)") }
                case .list:
                    break
                case .totals:
                    #expect(list.downloads == before, "\(where_)")
                    if case .totals(let t) = event { #expect(list.totals == t, "\(where_)") }
                }
                if list.downloads.map(\.id) != before.map(\.id) { #expect(change == .list, "\(where_)") }
                if case .snapshot = event { #expect(list.isLoaded) }
            }
        }
    }
}

/// What a UI reading ``DownloadList``'s rows is told: a progress tick changes that download's row
/// alone (not the list of rows, not another row); a download added or removed changes the list,
/// and the rows of the others stay the same objects.
@Suite struct DownloadListRowsTests {
    /// Whether reading `read` observed a change made by `change`.
    @MainActor func observes(_ read: @escaping @MainActor () -> Void, _ change: () -> Void) -> Bool {
        let changed = LockedBox(false)
        withObservationTracking { read() } onChange: { changed.value = true }
        change()
        return changed.value
    }

    @MainActor @Test func aTickChangesOneRowAndTheListKeepsItsRows() async throws {
        try await ManagerFixture().run { f in
            let m = try f.manager(autoStart: false)
            let list = DownloadList(manager: m)
            let info = (1...2).map { DownloadListStateTests.info($0, .waiting) }
            list.apply(.snapshot(info.reversed(), ManagerTotals()))
            #expect(list.rows.map(\.id.rawValue) == [1, 2])
            let (one, two) = (list.rows[0], list.rows[1])
            let tick = ManagerEvent.progress(two.id, DownloadProgress(bytesDone: 5, totalBytes: 1000, bytesPerSecond: 1))
            let tickSeenByItsRow = observes({ _ = two.info }, { list.apply(tick) })
            #expect(tickSeenByItsRow)
            #expect(two.info.progress.bytesDone == 5)
            let tickSeenByAnotherRow = observes({ _ = one.info }, { list.apply(tick) })
            #expect(!tickSeenByAnotherRow)
            let tickSeenByTheRows = observes({ _ = list.rows }, { list.apply(tick) })
            #expect(!tickSeenByTheRows)
            let tickSeenByDownloads = observes({ _ = list.downloads }, { list.apply(tick) })
            #expect(tickSeenByDownloads, "downloads observes everything")
            let addSeenByTheRows = observes({ _ = list.rows }, { list.apply(.added(DownloadListStateTests.info(3, .waiting))) })
            #expect(addSeenByTheRows)
            #expect(list.rows.count == 3 && list.rows[0] === one && list.rows[1] === two)
            list.apply(.removed(one.id))
            #expect(list.rows.map(\.id.rawValue) == [2, 3] && list.rows[0] === two)
            // Events for a download not listed (removed meanwhile) redraw nothing.
            let gone = DownloadListStateTests.info(1, .running)
            for stale in [ManagerEvent.progress(one.id, DownloadProgress(bytesDone: 9, totalBytes: 1000, bytesPerSecond: 1)),
                          .changed(gone), .removed(one.id)] {
                let seen = observes({ _ = list.downloads; _ = list.totals; _ = list.isLoaded; _ = list.rows }, { list.apply(stale) })
                #expect(!seen, "\(stale)")
            }
            #expect(list.downloads.map(\.id.rawValue) == [2, 3])
            await m.shutdown()
        }
    }
}
