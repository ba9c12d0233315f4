import Foundation
@testable import PickupDaemon
import Testing

@testable import Pickup

/// Settings changed over the API by many clients at once.
@Suite(.timeLimit(.minutes(4))) struct DaemonSettingsTests {
    /// Rounds of random PATCH /settings (a few refused) and GETs sent all at once to a daemon.
    /// After each round there must be an order in which the accepted changes ran one after the
    /// other, each answer being the state its change made from the one before, ending at the state
    /// the daemon shows after the round; every GET answered a state that was (the one before the
    /// round or a change's); the manager's settings and `settings.json` are the last state. Prints its seed; `PICKUP_SETTINGS_SEED` replays it.
    @Test func concurrentChangesEndAsIfOneRanAfterTheOther() async throws {
        let seed = propertySeed("PICKUP_SETTINGS_SEED", "daemon settings test")
        var random = SplitMix(state: seed)
        try await DaemonFixture().run { f in
            let started = f.daemon.configuration.transport.proxies
            // The state as the file holds it (the proxy's password in clear); nothing saved yet.
            var state = try await f.client.settings()

            for round in 0..<6 {
                let label = "round \(round) of seed \(seed)"
                let patches = (0..<24).map { _ in Self.patch(&random) }
                let reads = 6
                let client = f.client!
                var answers = [APISettings?](repeating: nil, count: patches.count)
                var read: [APISettings] = []
                try await withThrowingTaskGroup(of: (Int, APISettings?).self) { group in
                    for (i, p) in patches.enumerated() {
                        group.addTask { (i, try? await client.update(p)) }
                    }
                    for _ in 0..<reads { group.addTask { (-1, try await client.settings()) } }
                    for try await (i, answer) in group {
                        if i >= 0 { answers[i] = answer } else if let answer { read.append(answer) }
                    }
                }
                for (i, p) in patches.enumerated() {
                    #expect((answers[i] == nil) == Self.refused(p), "change \(i) of \(label): \(p) answered \(String(describing: answers[i]))")
                }
                let accepted = patches.indices.filter { answers[$0] != nil }.map { (patches[$0], answers[$0]!) }
                for r in read {
                    #expect(r == Self.shown(state) || accepted.contains { $0.1 == r }, "a GET of \(label) answered a state no change made: \(r)")
                }
                let after = try await client.settings()
                guard let order = Self.serialOrder(from: state, accepted, to: after) else {
                    Issue.record("no order of the \(accepted.count) changes of \(label) gives their answers and ends at \(after)")
                    break
                }
                state = order.reduce(state) { Self.applied(accepted[$1].0, to: $0) }
                let file = try JSONDecoder().decode(APISettings.self, from: Data(contentsOf: URL(fileURLWithPath: f.state.file("settings.json").string)))
                #expect(file == state, "settings.json after \(label)")
                let m = f.daemon.manager
                #expect(await m.maxConcurrentDownloads == state.maxConcurrentDownloads, "\(label)")
                #expect(await m.speedLimit == state.speedLimit, "\(label)")
                #expect(await m.order.rawValue == state.order, "\(label)")
                #expect(await m.startsAllAtOnce == state.startsAllAtOnce, "\(label)")
                var rules = started
                if let tunnel = state.proxyTunnel { rules.tunnel = tunnel }
                if let proxy = state.proxy { rules = try Daemon.proxyRules(proxy, over: rules) }
                #expect(await m.proxies == rules, "\(label)")
            }
        }
    }

    static let proxies: [String?] = [nil, "http://127.0.0.1:3128", "socks5h://127.0.0.1:1080", "http://user:secret@127.0.0.1:8080"]

    /// A change of one to three settings; about one in twelve is refused.
    static func patch(_ random: inout SplitMix) -> APISettingsPatch {
        func pick(_ n: Int) -> Int { Int(random.next() % UInt64(n)) }
        var p = APISettingsPatch()
        for _ in 0...pick(3) {
            switch pick(6) {
            case 0: p.maxConcurrentDownloads = pick(12) == 0 ? 0 : 1 + pick(64)
            case 1: p.speedLimit = .some(pick(3) == 0 ? nil : RateLimiter.minimum + Int64(pick(1_000_000)))
            case 2: p.proxy = .some(proxies[pick(proxies.count)])
            case 3: p.proxyTunnel = .some(pick(3) == 0 ? nil : pick(2) == 0)
            case 4: p.order = pick(12) == 0 ? "random" : pick(2) == 0 ? "fifo" : "lifo"
            default: p.startsAllAtOnce = pick(2) == 0
            }
        }
        return p
    }

    static func refused(_ p: APISettingsPatch) -> Bool {
        p.maxConcurrentDownloads == 0 || p.order == "random"
    }

    /// The state a change makes from `s`.
    static func applied(_ p: APISettingsPatch, to s: APISettings) -> APISettings {
        var s = s
        if let n = p.maxConcurrentDownloads { s.maxConcurrentDownloads = n }
        if let limit = p.speedLimit { s.speedLimit = limit }
        if let proxy = p.proxy { s.proxy = proxy }
        if let tunnel = p.proxyTunnel { s.proxyTunnel = tunnel }
        if let order = p.order { s.order = order }
        if let on = p.startsAllAtOnce { s.startsAllAtOnce = on }
        return s
    }

    /// A state as the API shows it.
    static func shown(_ s: APISettings) -> APISettings {
        var s = s
        s.proxy = s.proxy.map(ProxyURL.redacted)
        return s
    }

    /// An order of the changes in which each one's answer is the state it makes from the one
    /// before, and the last is `end` (depth first; an order that failed from a set of changes
    /// done and the last one is not tried again).
    static func serialOrder(from start: APISettings, _ changes: [(APISettingsPatch, APISettings)], to end: APISettings) -> [Int]? {
        var dead: Set<[Int]> = []  // [done as a bit set, last]
        var path: [Int] = []
        func search(_ s: APISettings, done: Int) -> Bool {
            if path.count == changes.count { return shown(s) == end }
            let key = [done, path.last ?? -1]
            if dead.contains(key) { return false }
            for (i, (p, answer)) in changes.enumerated() where done & (1 << i) == 0 {
                let next = applied(p, to: s)
                guard shown(next) == answer else { continue }
                path.append(i)
                if search(next, done: done | (1 << i)) { return true }
                path.removeLast()
            }
            dead.insert(key)
            return false
        }
        return search(start, done: 0) ? path : nil
    }
}
