import Foundation
import Testing
import TestServer

@testable import Pickup

extension DownloadManager {
    /// What the manager reports, taken in one step: every download, each state's list, the totals.
    func picture() -> (all: [DownloadInfo], lists: [DownloadState: [DownloadInfo]], totals: ManagerTotals) {
        (downloads(), Dictionary(uniqueKeysWithValues: DownloadState.allCases.map { ($0, downloads(in: $0)) }), totals())
    }
}

/// A manager driven by random control calls while its transfers run.
@Suite(.timeLimit(.minutes(2))) struct ManagerStateTests {
    /// A seeded random sequence of add (new, and again of a download it has), pause, resume,
    /// setPriority, cancel and remove, and of calls on removed downloads, on a manager whose
    /// transfers run (throttled) on the test server. After every call what it reports must follow
    /// the queue's rules and a model of what was asked: a download's priority is the one last
    /// set; it is paused exactly when it was paused and not resumed, else waiting or running; a
    /// removed one is unknown; adding one again changes nothing; the waiting list is in priority,
    /// then FIFO order; each state's list and the totals agree with the list of all; never more
    /// run than the limit. At the end: the free slots fill, the event stream gives the same
    /// picture through allowed transitions only, and a new manager on the same state restores it.
    /// Prints its seed; `PICKUP_MANAGER_SEED` replays it.
    @Test func randomControlKeepsEveryStateAndPriorityAsTheQueueSays() async throws {
        let seed = propertySeed("PICKUP_MANAGER_SEED", "manager state test")
        var random = SplitMix(state: seed)
        func pick(_ n: Int) -> Int { Int(random.next() % UInt64(max(1, n))) }

        struct Wanted: Equatable {
            var url: String
            var paused: Bool
            var priority: Int
        }
        try await ManagerFixture().run { f in
            let limit = 2
            let m = try f.manager(limit: limit)
            let changes = await m.changes().stream
            // 100 s a download: none ends during the test.
            let body = Resource.bytes(count: 1 << 20)
            var model: [DownloadID: Wanted] = [:]
            var gone: [DownloadID] = []
            var paths = 0

            /// What the manager reports that breaks a rule (nothing when all hold).
            func problems() async -> [String] {
                var found: [String] = []
                let (all, lists, totals) = await m.picture()
                if all.map(\.id) != model.keys.sorted() { found.append("downloads \(all.map(\.id)), wanted \(model.keys.sorted())") }
                for info in all {
                    guard let wanted = model[info.id] else { continue }
                    if info.priority != wanted.priority { found.append("\(info.id)'s priority is \(info.priority), not \(wanted.priority)") }
                    if wanted.paused ? info.state != .paused : info.state != .waiting && info.state != .running {
                        found.append("\(info.id) is \(info.state), wanted \(wanted.paused ? "paused" : "waiting or running")")
                    }
                }
                for state in DownloadState.allCases {
                    let expected = all.filter { $0.state == state }
                    let ordered = state != .waiting ? expected
                        : expected.sorted { $0.priority != $1.priority ? $0.priority > $1.priority : $0.id < $1.id }
                    if lists[state]?.map(\.id) != ordered.map(\.id) {
                        found.append("the \(state) list is \(lists[state]?.map(\.id) ?? []), not \(ordered.map(\.id))")
                    }
                    if totals.count(state) != expected.count { found.append("\(totals.count(state)) \(state) in the totals, not \(expected.count)") }
                }
                let running = all.filter { $0.state == .running }.count
                if running > limit { found.append("\(running) running, over the limit") }
                for id in gone.suffix(3) where await m.download(id) != nil { found.append("\(id) was removed") }
                return found
            }

            for step in 0..<150 {
                let label = "step \(step) of seed \(seed)"
                let ids = model.keys.sorted()
                let id = ids.isEmpty ? nil : ids[pick(ids.count)]
                let op = ids.isEmpty ? 0 : pick(10)
                if op <= 2, model.count < 12 || id == nil {
                    paths += 1
                    let path = "/q/\(paths).bin"
                    f.server.set(path, Resource(body: body, bytesPerSecond: 10_000))
                    let wanted = Wanted(url: f.server.url(path), paused: pick(3) == 0, priority: pick(5) - 2)
                    let new = try await m.add(wanted.url, to: .directory(f.dir.path), priority: wanted.priority, paused: wanted.paused)
                    #expect(model[new] == nil && !gone.contains(new), "a new id at \(label)")
                    model[new] = wanted
                } else if let id, op <= 3 {
                    let again = try await m.add(model[id]!.url, to: .directory(f.dir.path), priority: pick(5) - 2, paused: pick(2) == 0)
                    #expect(again == id, "adding \(id)'s URL again at \(label)")
                } else if let id, op == 4 {
                    try await m.pause(id)
                    model[id]!.paused = true
                } else if let id, op == 5 {
                    try await m.resume(id)
                    model[id]!.paused = false
                } else if let id, op == 6 {
                    let p = pick(5) - 2
                    try await m.setPriority(id, p)
                    model[id]!.priority = p
                } else if let id, op <= 8 {
                    if op == 7 {
                        try await m.cancel(id, deletePartial: pick(2) == 0)
                    } else {
                        try await m.remove(id, deletePartial: pick(2) == 0)
                    }
                    model[id] = nil
                    gone.append(id)
                } else if let removed = gone.isEmpty ? nil : gone[pick(gone.count)] {
                    // A removed download is unknown to every call.
                    switch pick(5) {
                    case 0: await #expect(throws: PickupError.self, "\(label)") { try await m.pause(removed) }
                    case 1: await #expect(throws: PickupError.self, "\(label)") { try await m.resume(removed) }
                    case 2: await #expect(throws: PickupError.self, "\(label)") { try await m.setPriority(removed, 1) }
                    case 3: await #expect(throws: PickupError.self, "\(label)") { try await m.cancel(removed) }
                    default: await #expect(throws: PickupError.self, "\(label)") { try await m.remove(removed) }
                    }
                }
                let found = await problems()
                if !found.isEmpty {
                    Issue.record("at \(label): \(found.joined(separator: "; "))")
                    break
                }
            }

            // Once the transfers being stopped have ended, the free slots fill.
            let active = model.values.filter { !$0.paused }.count
            if !(await eventually(seconds: 30, every: 0.02) { await m.picture().lists[.running]?.count == min(limit, active) }) {
                Issue.record("\(await m.picture().lists[.running]?.count ?? 0) running, not \(min(limit, active)) (seed \(seed))")
            }
            let found = await problems()
            #expect(found.isEmpty, "at the end of seed \(seed): \(found.joined(separator: "; "))")

            // The event stream tells the same, through transitions the queue allows.
            let page = await m.snapshotPage(after: nil, limit: 1000)
            var view: [DownloadID: (state: DownloadState, priority: Int)] = [:]
            for await e in changes {
                switch e.event {
                case .added(let info):
                    view[info.id] = (info.state, info.priority)
                case .changed(let info):
                    if let before = view[info.id]?.state {
                        #expect(before == info.state || DownloadQueue.allows(before, info.state),
                                "\(info.id) went from \(before) to \(info.state) (seed \(seed))")
                    }
                    view[info.id] = (info.state, info.priority)
                case .removed(let id):
                    view[id] = nil
                default:
                    break
                }
                if e.seq >= page.seq { break }
            }
            #expect(view.keys.sorted() == page.downloads.map(\.id), "the event stream's downloads (seed \(seed))")
            for info in page.downloads {
                #expect(view[info.id]?.state == info.state && view[info.id]?.priority == info.priority,
                        "\(info.id) in the event stream (seed \(seed))")
            }

            // A new manager on the same state: the same priorities, paused ones paused, others waiting.
            await m.shutdown()
            let restored = try f.manager(limit: limit, autoStart: false)
            let (all, lists, _) = await restored.picture()
            #expect(all.map(\.id) == model.keys.sorted(), "restored (seed \(seed))")
            for info in all {
                #expect(info.priority == model[info.id]?.priority && info.state == (model[info.id]?.paused == true ? .paused : .waiting),
                        "\(info.id) restored as \(info.state), priority \(info.priority) (seed \(seed))")
            }
            #expect(lists[.waiting]?.map(\.id)
                == all.filter { $0.state == .waiting }.sorted { $0.priority != $1.priority ? $0.priority > $1.priority : $0.id < $1.id }.map(\.id),
                "the restored waiting list (seed \(seed))")
            await restored.shutdown()
        }
    }
}
