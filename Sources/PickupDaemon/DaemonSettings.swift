import Pickup

/// The daemon's settings (`GET` and `PATCH /settings`, `settings.json`): their one owner.
///
/// A change is one step: checked, carried out on the manager, saved, and only then the current
/// state. Changes take turns in the order they came (an actor alone would interleave them at
/// every `await`), so two PATCHes at once end as if one had run after the other: each answer is
/// the state its change made, and the file holds the last state applied. Reading the settings
/// waits for no change: it gets the last state applied. The file is written on the blocking-I/O
/// pool, never on Swift's cooperative pool.
actor DaemonSettings {
    /// The state as last applied, the proxy with its password (as the file holds it).
    private var current: APISettings
    private let manager: DownloadManager
    private let files: DaemonFiles
    /// The proxies `pickup serve` was started with (a proxy set through the API goes over them).
    private let started: ProxyRules
    /// Whether a change is under way; those waiting for their turn, first come first.
    private var changing = false
    private var waiting: [CheckedContinuation<Void, Never>] = []

    init(_ initial: APISettings, manager: DownloadManager, files: DaemonFiles, started: ProxyRules) {
        current = initial
        self.manager = manager
        self.files = files
        self.started = started
    }

    /// The settings as last applied, the proxy's password as `***`.
    func shown() -> APISettings { Self.redacted(current) }

    /// Applies and saves a change of settings; returns the state it made (the proxy's password
    /// as `***`). A refused change changes nothing.
    func apply(_ patch: APISettingsPatch) async throws(APIError) -> APISettings {
        await takeTurn()
        defer { endTurn() }
        var next = current
        if let n = patch.maxConcurrentDownloads {
            guard (1...64).contains(n) else { throw .badRequest("maxConcurrentDownloads must be 1 to 64") }
            next.maxConcurrentDownloads = n
        }
        if let limit = patch.speedLimit {
            if let limit, limit < RateLimiter.minimum {
                throw .badRequest("speedLimit must be at least \(RateLimiter.minimum) bytes per second, or null for none")
            }
            next.speedLimit = limit
        }
        var order: QueueOrder? = nil
        if let text = patch.order {
            guard let o = QueueOrder(rawValue: text) else { throw .badRequest("order must be fifo or lifo") }
            order = o
            next.order = text
        }
        if let on = patch.startsAllAtOnce { next.startsAllAtOnce = on }
        if let proxy = patch.proxy { next.proxy = proxy }
        if let tunnel = patch.proxyTunnel { next.proxyTunnel = tunnel }
        var rules: ProxyRules? = nil
        if patch.proxy != nil || patch.proxyTunnel != nil {
            var started = started
            if let tunnel = next.proxyTunnel { started.tunnel = tunnel }
            do throws(PickupError) {
                rules = try next.proxy.map { text throws(PickupError) in try Daemon.proxyRules(text, over: started) } ?? started
            } catch {
                throw .badRequest("proxy: \(error.description)")
            }
        }
        if let n = patch.maxConcurrentDownloads { await manager.setMaxConcurrentDownloads(n) }
        if let limit = patch.speedLimit { await manager.setSpeedLimit(limit) }
        if let order { await manager.setOrder(order) }
        if let on = patch.startsAllAtOnce { await manager.setStartsAllAtOnce(on) }
        // A proxy an API client chose carries no one's secrets (null: back to serve's own).
        if let rules { await manager.setProxies(rules, trusted: next.proxy == nil) }
        let files = files
        let saved = next
        _ = try? await BlockingIO.run { files.saveSettings(saved) }
        current = next
        return Self.redacted(next)
    }

    /// Waits until no other change is under way, then holds the turn until ``endTurn()``.
    private func takeTurn() async {
        guard changing else {
            changing = true
            return
        }
        await withCheckedContinuation { waiting.append($0) }
    }

    /// Hands the turn to the next change waiting, if any.
    private func endTurn() {
        if waiting.isEmpty {
            changing = false
        } else {
            waiting.removeFirst().resume()
        }
    }

    static func redacted(_ s: APISettings) -> APISettings {
        var s = s
        s.proxy = s.proxy.map(ProxyURL.redacted)
        return s
    }
}
