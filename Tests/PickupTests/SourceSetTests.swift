import Foundation
import Testing

@testable import Pickup

/// ``SourceSet``'s rules, explored: seeded random sequences of what connections and servers do
/// (bind, unbind, bytes measured, busy and failed answers, acceptance, retirement, bad pieces,
/// take-overs, mirrors learnt, new rounds), with the rules checked after every event. No server:
/// the machine is a value. `PICKUP_SOURCESET_SEED` replays a run (its seed is printed).
@Suite struct SourceSetTests {
    /// The bindings and each source's connections say the same thing, caps stay at least one, and
    /// a live source always remains.
    static func consistent(_ s: SourceSet, _ label: String) {
        for (connection, source) in s.binding {
            #expect(s.sources[source].connections.contains(connection), "\(label): \(connection) bound to \(source), not in its set")
        }
        for (i, source) in s.sources.enumerated() {
            for c in source.connections { #expect(s.binding[c] == i, "\(label): \(c) in \(i)'s set, bound to \(String(describing: s.binding[c]))") }
            #expect(source.cap >= 1, "\(label): source \(i) cap \(source.cap)")
            #expect(source.answered.isSubset(of: source.connections), "\(label): source \(i) answered by unbound connections")
        }
        #expect(!s.live.isEmpty, "\(label): no live source left")
    }

    /// Where a connection was sent: a live source other than the one it left, and bound there.
    static func movedWell(_ next: SourceSet.Next, from source: Int, connection: Int, _ s: SourceSet, _ label: String) {
        guard case .moveTo(let to) = next else { return }
        #expect(to != source && !s.isRetired(to), "\(label): moved to \(to) from \(source)")
        #expect(s.binding[connection] == to, "\(label): moved to \(to), bound to \(String(describing: s.binding[connection]))")
    }

    /// Seeds that found a bug, replayed every run: 2194922337, a new round kept the connections
    /// that had answered in the last one (``SourceSet/newRound(connections:)``).
    static let fixedSeeds: [UInt64] = [2_194_922_337]

    @Test func randomEventsKeepEveryRule() {
        let env = ProcessInfo.processInfo.environment
        let seed = env["PICKUP_SOURCESET_SEED"].flatMap { UInt64($0) } ?? UInt64.random(in: 1...UInt64(UInt32.max))
        print("source set: seed \(seed) (replay with PICKUP_SOURCESET_SEED=\(seed))")
        for s in Self.fixedSeeds + [seed] { Self.explore(seed: s) }
    }

    static func explore(seed: UInt64) {
        var random = SplitMix(state: seed)
        for run in 0..<300 {
            let urls = (0..<Int.random(in: 1...4, using: &random)).map { "http://m\($0).example/f" }
            var s = SourceSet(urls: urls, connections: Int.random(in: 1...8, using: &random))
            var events: [String] = []
            for _ in 0..<60 {
                let c = Int.random(in: 0..<10, using: &random)
                let source = Int.random(in: 0..<s.sources.count, using: &random)
                let label = "seed \(seed) run \(run): \(events.suffix(12).joined(separator: ", "))"
                switch Int.random(in: 0..<13, using: &random) {
                case 0, 1:
                    var freed = s  // (bind lets go of the connection's source first)
                    freed.unbind(c)
                    let picked = freed.pick()
                    let before = picked.map { freed.sources[$0].connections.count }
                    let bound = s.bind(c)
                    events.append("bind \(c) -> \(bound.map(String.init) ?? "-")")
                    if let b = bound {
                        #expect(!s.isRetired(b), "\(label): bound to a retired source")
                        #expect(s.sources[b].connections.count <= s.sources[b].cap, "\(label): over the cap of \(b)")
                        #expect(b == picked && (before ?? 0) < s.sources[b].cap, "\(label)")
                        let clean = s.live.contains { $0 != b && s.sources[$0].badPieces == 0 && s.sources[$0].connections.count < s.sources[$0].cap }
                        #expect(s.sources[b].badPieces == 0 || !clean, "\(label): a source with bad pieces chosen while a clean one had room")
                    } else {
                        #expect(s.binding[c] == nil && picked == nil, "\(label)")
                    }
                case 2:
                    s.unbind(c)
                    events.append("unbind \(c)")
                    #expect(s.binding[c] == nil, "\(label)")
                case 3:
                    s.measured(source, bytes: Int64.random(in: 0...1_000_000, using: &random), seconds: Double.random(in: 0...2, using: &random))
                    events.append("measured \(source)")
                case 4:
                    s.bind(c, to: s.live.randomElement(using: &random) ?? 0)
                    let on = s.binding[c]!
                    let (next, _) = s.busy(on, connection: c, othersFetching: Bool.random(using: &random), why: "busy")
                    events.append("busy \(c)@\(on) -> \(next)")
                    movedWell(next, from: on, connection: c, s, label)
                case 5:
                    s.bind(c, to: s.live.randomElement(using: &random) ?? 0)
                    let on = s.binding[c]!
                    let (next, retired) = s.failed(on, connection: c, why: "failed")
                    events.append("failed \(c)@\(on) -> \(next)\(retired == nil ? "" : " retired")")
                    movedWell(next, from: on, connection: c, s, label)
                    if retired != nil { #expect(s.isRetired(on), "\(label)") }
                    if case .leave = next { #expect(s.binding[c] == nil, "\(label): left, still bound") }
                case 6:
                    s.accepted(source, connection: Bool.random(using: &random) ? c : nil)
                    events.append("accepted \(source)")
                case 7:
                    let wasLive = s.live
                    let notice = s.retire(source, why: "gone")
                    events.append("retire \(source)\(notice == nil ? " refused" : "")")
                    if notice != nil { #expect(wasLive.contains { $0 != source }, "\(label): the last live source retired") }
                case 8:
                    let notice = s.retireOtherFile(source, why: "other file")
                    events.append("retireOtherFile \(source)\(notice == nil ? " refused" : "")")
                    if notice == nil { #expect(s.live == [source], "\(label): refused though another is live") }
                case 9:
                    _ = s.badPiece(source)
                    events.append("badPiece \(source)")
                case 10:
                    if let on = s.binding[c] {
                        let to = s.takeOver(c, from: on)
                        events.append("takeOver \(c)@\(on) -> \(to.map(String.init) ?? "-")")
                        if let to { #expect(to != on && !s.isRetired(to) && s.binding[c] == to, "\(label)") }
                    }
                case 11:
                    let added = s.add("http://late\(Int.random(in: 0..<3, using: &random)).example/f", connections: 4)
                    events.append("add -> \(added.map(String.init) ?? "-")")
                default:
                    s.newRound(connections: Int.random(in: 1...8, using: &random))
                    events.append("newRound")
                    #expect(s.binding.isEmpty, "\(label)")
                }
                consistent(s, "seed \(seed) run \(run): \(events.suffix(12).joined(separator: ", "))")
            }
        }
    }
}
