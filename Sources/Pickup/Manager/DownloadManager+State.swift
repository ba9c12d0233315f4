import Foundation
import NIOConcurrencyHelpers
import SystemPackage

/// Bookkeeping of ``DownloadManager``: state changes, the database, events, totals.
extension DownloadManager {
    /// Moves a download through the queue's state machine; saves and announces it when it moved.
    func moveTo(_ id: DownloadID, _ state: DownloadState) {
        guard queue.transition(id, to: state) else { return }
        update(id) {
            if state == .waiting { $0.failure = nil; $0.finishedAt = nil }
            if state != .running { $0.progress.bytesPerSecond = 0 }
        }
        persist(id)
        emitChanged(id)
        setChanged()
    }

    /// Cancels a running transfer, remembering why so that its end is handled as asked.
    func stop(_ id: DownloadID, _ intent: StopIntent) {
        guard let run = running[id] else { return }
        stopping[id] = intent
        run.task.cancel()
    }

    func update(_ id: DownloadID, _ change: (inout DownloadDetails) -> Void) {
        guard var d = details[id] else { return }
        change(&d)
        details[id] = d
    }

    /// A download as it is now: its details, and its state and priority as the queue has them.
    func info(_ id: DownloadID) -> DownloadInfo? {
        guard let d = details[id], let entry = queue.entries[id] else { return nil }
        return d.info(entry)
    }

    /// A download's state, as the queue has it.
    func state(of id: DownloadID) -> DownloadState? { queue.entries[id]?.state }

    /// Saves a download's row (its state as given, else as it is), on the blocking-I/O pool. A
    /// failure to save costs nothing but the row's freshness: the download itself goes on, the
    /// engine's control file still holds its bytes, and the next change writes the row again.
    func persist(_ id: DownloadID, state: DownloadState? = nil) {
        guard var info = info(id), let place = queue.entries[id]?.place else { return }
        if let state { info.state = state }
        store.update([DownloadRow(info: info, place: place, bases: configuration.pathBases)])
    }

    func emit(_ event: ManagerEvent) {
        eventSeq += 1
        let numbered = SequencedEvent(seq: eventSeq, event: event)
        for (key, o) in observers where !o.send(numbered) {
            // Too far behind: end its sequence rather than let it miss an event.
            observers[key] = nil
            o.end()
        }
    }

    func emitChanged(_ id: DownloadID) {
        if let info = info(id) { emit(.changed(info)) }
    }

    /// Downloads changed state: totals are sent at the next tick. When the set of downloads
    /// changed (added, removed, queued again), the fraction may go down: there is more to fetch.
    func setChanged(newWork: Bool = false) {
        totalsDirty = true
        if newWork { floorFraction = 0 }
        startTicker()
    }

    /// Takes what the engine reported for a running download: its progress and notices, the
    /// progress with the limit that holds it back, if any (`totalSpeed`: of every running
    /// download, for the global limit).
    func drain(_ id: DownloadID, _ box: NIOLockedValueBox<Reported>?, totalSpeed: Double = 0) {
        guard let box else { return }
        let reported = box.withLockedValue { r -> Reported in
            defer { r.notices = []; r.progress = nil }
            return r
        }
        for n in reported.notices { emit(.notice(id, n)) }
        if var p = reported.progress, state(of: id) == .running {
            let stalled = p.stallTimeout != nil
            p.limitedBy = limiters[id]?.holds(atSpeed: p.bytesPerSecond, stalled: stalled) == true ? .download
                : globalLimiter.holds(atSpeed: totalSpeed, stalled: stalled) ? .global : nil
            guard details[id]?.progress != p else { return }
            update(id) { $0.progress = p }
            emit(.progress(id, p))
            totalsDirty = true
        }
    }

    /// Sends progress and totals every ``Configuration/progressInterval`` while anything runs or changed.
    func startTicker() {
        guard ticker == nil, !isShutDown else { return }
        let interval = configuration.progressInterval
        ticker = Task {
            while !Task.isCancelled {
                try? await Task.sleep(nanoseconds: Seconds.nanoseconds(interval))
                if !self.tick() { break }
            }
        }
    }

    /// One tick; returns whether to keep ticking.
    private func tick() -> Bool {
        let speed = running.keys.reduce(0.0) { $0 + (details[$1]?.progress.bytesPerSecond ?? 0) }
        for (id, run) in running { drain(id, run.box, totalSpeed: speed) }
        if totalsDirty { emitTotals() }
        if running.isEmpty && !totalsDirty {
            ticker = nil
            return false
        }
        return true
    }

    func emitTotals() {
        totalsDirty = false
        guard !observers.isEmpty else { return }
        emit(.totals(computeTotals()))
    }

    func computeTotals() -> ManagerTotals {
        var t = ManagerTotals()
        var knownDone: Int64 = 0
        for (id, e) in queue.entries {
            t.counts[e.state, default: 0] += 1
            guard let progress = details[id]?.progress else { continue }
            t.bytesDone += progress.bytesDone
            if let total = progress.totalBytes {
                t.totalBytes += total
                knownDone += min(total, progress.bytesDone)
            }
            if e.state == .running { t.bytesPerSecond += progress.bytesPerSecond }
        }
        if t.totalBytes > 0 {
            let f = max(floorFraction, Double(knownDone) / Double(t.totalBytes))
            floorFraction = f
            t.fraction = f
        }
        t.knownBytesDone = knownDone
        return t
    }

    // MARK: - Checks and conversions

    func checkOpen() throws(PickupError) {
        if isShutDown { throw .invalidInput("the download manager is shut down") }
    }

    func checkKnown(_ id: DownloadID) throws(PickupError) {
        try checkOpen()
        if details[id] == nil { throw .invalidInput("no download with id \(id)") }
    }

    /// The engine's request for a download.
    static func request(for d: DownloadDetails, root: FilePath?) -> DownloadRequest {
        DownloadRequest(url: d.url, destination: d.destination, checksum: d.checksum, overwrite: d.overwrite,
                        connections: d.connections, root: root, options: d.options, mirrors: d.mirrors,
                        pieces: d.pieces, length: d.length)
    }

    /// A destination with an absolute path, so that it means the same after a restart elsewhere.
    static func absolute(_ d: Destination) -> Destination {
        func abs(_ p: FilePath) -> FilePath {
            p.isAbsolute ? p.lexicallyNormalized() : FilePath(FileManager.default.currentDirectoryPath).pushing(p).lexicallyNormalized()
        }
        switch d {
        case .file(let p): return .file(abs(p))
        case .directory(let p): return .directory(abs(p))
        }
    }

    static func validate(_ url: String, _ destination: Destination, connections: Int? = nil, mirrors: [String] = []) throws(PickupError) {
        try DownloadURL.check(url)
        guard mirrors.count <= 64 else { throw .invalidInput("at most 64 mirrors, not \(mirrors.count)") }
        for m in mirrors { try DownloadURL.check(m) }
        if let n = connections, !(1...32).contains(n) { throw .invalidInput("connections must be 1 to 32, not \(n)") }
        _ = try DownloadFiles.paths(for: DownloadRequest(url: url, destination: destination))
    }

    /// Whether a completed download's file is still at its path with its size.
    static func fileIsThere(_ d: DownloadDetails, root: FilePath?) -> Bool {
        guard let (dir, name) = finishedFile(of: d, root: root), let size = dir.size(name) else { return false }
        return d.progress.totalBytes.map { $0 == size } ?? true
    }

    /// Deletes a completed download's file if it is still the one downloaded (through its
    /// directory's handle: a symlink planted since, on the way or at the name, is never followed).
    static func deleteFile(of d: DownloadDetails, root: FilePath?) {
        guard let (dir, name) = finishedFile(of: d, root: root), let size = dir.size(name),
            d.progress.totalBytes.map({ $0 == size }) ?? true
        else { return }
        dir.remove(name)
    }

    /// The open directory of a finished download's file, and its name there.
    static func finishedFile(of d: DownloadDetails, root: FilePath?) -> (DirectoryHandle, String)? {
        guard let path = d.path, let name = path.lastComponent?.string,
            let dir = try? DirectoryHandle.open(path.removingLastComponent(), under: root, create: false)
        else { return nil }
        return (dir, name)
    }
}
