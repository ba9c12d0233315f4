import NIOConcurrencyHelpers

/// The periodic work of every running download of one ``Downloader``, on one task: progress
/// reports, checkpoints and the connection tuner's samples (``FileDownload/tick(now:)``).
///
/// One task wakes every `interval` (the shorter of the progress and checkpoint intervals), or
/// every ``ConnectionTuner/step`` while a download's tuner is deciding, and ticks the downloads
/// registered at that moment. Downloads come and go with a lock and a dictionary entry, not a
/// task and a timer each: a batch of small files that end within a few milliseconds cost a
/// tenth of their CPU in monitor tasks before. The task ends when no download is registered.
final class DownloadMonitor: @unchecked Sendable {
    let interval: Double
    private let lock = NIOLock()
    // Guarded by `lock`.
    private var members: [ObjectIdentifier: FileDownload] = [:]
    /// Which loop is the current one; an older loop ends at its next wake.
    private var generation = 0
    private var running = false
    private var fast = false

    init(interval: Double) { self.interval = max(0.001, interval) }

    /// Ticks `download` from the next wake on.
    func add(_ download: FileDownload) {
        lock.withLock {
            members[ObjectIdentifier(download)] = download
            if !running { startLocked(fast: false) }
        }
    }

    /// No more ticks for `download` (one in progress is the download's own to wait for).
    func remove(_ download: FileDownload) {
        _ = lock.withLock { members.removeValue(forKey: ObjectIdentifier(download)) }
    }

    /// A download's tuner has started deciding: wake every ``ConnectionTuner/step`` from now on
    /// (until no download is deciding).
    func sampleOften() {
        lock.withLock {
            if !fast { startLocked(fast: true) }
        }
    }

    private func startLocked(fast: Bool) {
        generation += 1
        running = true
        self.fast = fast
        let current = generation
        Task { await self.loop(current) }
    }

    private func loop(_ current: Int) async {
        while true {
            let step = lock.withLock { fast ? ConnectionTuner.step : interval }
            try? await Task.sleep(nanoseconds: Seconds.nanoseconds(step))
            let list: [FileDownload]? = lock.withLock {
                guard generation == current else { return nil }
                if members.isEmpty {
                    running = false
                    fast = false
                    return nil
                }
                return Array(members.values)
            }
            guard let list else { return }
            let now = Clock.monotonic()
            var deciding = false
            for download in list where download.tick(now: now) { deciding = true }
            lock.withLock { if generation == current { fast = deciding } }
        }
    }
}
