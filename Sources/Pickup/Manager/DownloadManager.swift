import Foundation
import NIOConcurrencyHelpers
import SystemPackage

/// Owns many downloads: a persistent queue with a limit on how many run at once, priorities,
/// FIFO or LIFO, pause/resume/cancel, speed limits, and events that any number of observers can
/// follow. Everything survives the process ending in any way: a new manager on the same state
/// directory restores every download and resumes those that were running.
///
/// ```swift
/// var config = DownloadManager.Configuration(stateDirectory: "/var/lib/myapp/downloads")
/// config.maxConcurrentDownloads = 3
/// let manager = try DownloadManager(configuration: config)
/// let id = try await manager.add("https://example.com/episode-1.mp3", to: .directory("/data/episodes"))
/// for await event in await manager.events() {
///     switch event {
///     case .snapshot(let all, _): print(all.count, "downloads")
///     case .progress(let id, let p): print(id, p.bytesDone, p.fraction ?? 0)
///     case .changed(let info) where info.state == .completed: print("saved", info.path!)
///     case .changed(let info) where info.state == .failed: print("failed:", info.failure!)
///     default: break
///     }
/// }
/// ```
///
/// The queue and each download's options and state are in SQLite (`manager.sqlite`, through
/// GRDB); the bytes and their progress are in the engine's control files, checkpointed every
/// second. One process at a time drives a state directory (an advisory lock, dropped by the
/// kernel when the process dies).
public actor DownloadManager {
    /// How a manager behaves.
    public struct Configuration: Sendable {
        /// Where the database, the lock and the completion records live.
        public var stateDirectory: FilePath
        /// Downloads transferring at once (changeable with ``DownloadManager/setMaxConcurrentDownloads(_:)``).
        public var maxConcurrentDownloads = 3
        /// Start every waiting download at once, whatever the limit (batch mode).
        public var startsAllAtOnce = false
        /// Which waiting download of equal priority starts first.
        public var order: QueueOrder = .fifo
        /// Global speed limit in bytes per second, over all downloads (nil: none).
        public var speedLimit: Int64?
        /// Start (and resume restored) downloads as soon as the manager exists; when false, nothing
        /// starts until ``DownloadManager/start()``.
        public var autoStart = true
        /// How often progress events are sent, in seconds.
        public var progressInterval = 0.25
        /// Engine settings for every download (connections, retries, checkpoint interval...).
        public var engine = DownloadOptions()
        /// HTTP settings (timeouts, TLS).
        public var transport = HTTPClientTransport.Options()
        /// When set, every download's file must lie inside this directory and nothing below it is
        /// reached through a symlink, at every run and every deletion (``DownloadRequest/root``).
        public var root: FilePath?
        /// Proxies set by someone other than the owner (a daemon's API client): transfers go through
        /// them, except those carrying secrets (``RequestOptions/carriesSecrets``), which keep
        /// `transport`'s proxies, so that no one can route another's credentials through a proxy of
        /// their choosing.
        public var untrustedProxies: ProxyRules?
        /// Restore paused (with a failure saying why) a download that was running each of the
        /// last two times the process died without shutting the manager down: one download cannot
        /// put an app or a daemon in a crash loop (see `CrashGuard`).
        public var crashGuard = true
        /// Directories that stored paths are relative to (``PathBases``): on Apple platforms the app's
        /// container by default, so that downloads survive the container moving between launches.
        /// Give the same names at every launch.
        public var pathBases = PathBases.standard

        /// A configuration with its state in `stateDirectory`.
        public init(stateDirectory: FilePath) { self.stateDirectory = stateDirectory }
    }

    /// Why a running download is being stopped, so its end is handled as asked.
    enum StopIntent { case pause, requeue, cancel(deletePartial: Bool), shutdown }

    /// A transfer in progress: its task, and what the engine last reported (written on the
    /// engine's monitor task, read by the ticker).
    struct Run {
        let task: Task<Void, Never>
        let box: NIOLockedValueBox<Reported>
        let request: DownloadRequest
    }

    struct Reported {
        var progress: DownloadProgress?
        var notices: [String] = []
    }

    struct Key: Hashable {
        let url: String
        let kind: String
        let path: String
        init(_ url: String, _ destination: Destination) {
            self.url = url
            (kind, path) = DownloadRow.destinationColumns(destination)
        }
    }

    let configuration: Configuration
    let store: ManagerStore
    /// The state directory's lock (`manager.lock`); nil while suspended (see ``suspend()``).
    var lockFile: PartialFile?
    /// The last start or suspension asked for: each runs whole after the one before (a start
    /// that takes the lock back and a suspension that releases it never interleave).
    var lifeChain: Task<Void, Never>?
    /// The engine new transfers run on (replaced by ``setProxies(_:)``); a replaced one is shut
    /// down once the transfers on it have ended (or with the manager).
    var downloader: Downloader
    /// While the proxies are untrusted: the engine on the owner's proxies, for transfers that
    /// carry secrets.
    var trustedDownloader: Downloader?
    var retiredDownloaders: [ObjectIdentifier: Downloader] = [:]
    var engineOptions: DownloadOptions
    var transportOptions: HTTPClientTransport.Options
    let globalLimiter: RateLimiter

    /// Every download's state, priority and place: the one place they are kept.
    var queue: DownloadQueue
    /// The rest of what is known of every download (``info(_:)`` puts the two together).
    var details: [DownloadID: DownloadDetails] = [:]
    var keys: [Key: DownloadID] = [:]
    var limiters: [DownloadID: RateLimiter] = [:]
    var running: [DownloadID: Run] = [:]
    var stopping: [DownloadID: StopIntent] = [:]
    var observers: [Int: Observer] = [:]
    var nextObserver = 0
    /// The number of the latest event sent (events are numbered from 1).
    var eventSeq: UInt64 = 0
    /// Every download's id, in order (for paged snapshots).
    var sortedIDs: [DownloadID] = []
    var maxConcurrent: Int
    var startsAll: Bool
    var started: Bool
    var isShutDown = false
    var ticker: Task<Void, Never>?
    var totalsDirty = true
    /// The last fraction reported, kept while the set of downloads is the same (see ``ManagerTotals/fraction``).
    var floorFraction: Double = 0
    /// Partial-file deletions under way, by (URL, destination): no run of those starts meanwhile.
    var deleting: [Key: Int] = [:]
    /// The log of what runs, for the next start to tell a crash loop (nil: off or unusable).
    let crashGuard: CrashGuard?

    // MARK: - Life

    /// Opens (or creates) the state directory, takes its lock, and restores every download (blocking
    /// file and database reads on the calling thread: from a task or the main thread, prefer
    /// ``open(configuration:)``):
    /// those that were running or waiting wait to start (and start at once with ``Configuration/autoStart``),
    /// paused ones stay paused, finished ones keep their result.
    /// - Throws: ``PickupError/stateInUse(_:)`` when another process drives this state directory;
    ///   ``PickupError/fileSystem(_:_:)`` when it cannot be created or read.
    public init(configuration: Configuration) throws(PickupError) {
        let dir = configuration.stateDirectory
        try StateDirectory.prepare(dir)
        let lock = try PartialFile(path: dir.appending("manager.lock"))
        // Asked again for up to a second: a lock released a moment ago can still be held by a
        // child that another thread of this process is spawning (its copy of the descriptor lives
        // until it execs, and flock locks belong to the open file).
        guard lock.lock(within: 1) else {
            lock.close()
            throw .stateInUse(dir.string)
        }
        let store: ManagerStore
        let rows: [DownloadRow]
        do {
            store = try ManagerStore(directory: dir)
            rows = try store.all()
        } catch {
            lock.close()
            throw .fileSystem("\(dir.appending("manager.sqlite")): \(error)", .ioError)
        }
        var engine = configuration.engine
        if engine.stateDirectory == nil { engine.stateDirectory = dir }
        if engine.pathBases.bases.isEmpty { engine.pathBases = configuration.pathBases }
        self.configuration = configuration
        self.store = store
        self.lockFile = lock
        var transport = configuration.transport
        if let untrusted = configuration.untrustedProxies {
            transport.proxies = untrusted
            trustedDownloader = Downloader(options: engine, transport: configuration.transport)
        }
        self.downloader = Downloader(options: engine, transport: transport)
        self.engineOptions = engine
        self.transportOptions = transport
        self.globalLimiter = RateLimiter(bytesPerSecond: configuration.speedLimit)
        self.queue = DownloadQueue(order: configuration.order)
        self.maxConcurrent = max(1, configuration.maxConcurrentDownloads)
        self.startsAll = configuration.startsAllAtOnce
        self.started = configuration.autoStart
        let (crashGuard, suspects) = configuration.crashGuard ? CrashGuard.start(in: dir) : (nil, [])
        self.crashGuard = crashGuard
        var held: [DownloadRow] = []
        for row in rows {
            var info = row.info(bases: configuration.pathBases)
            // A download that was running when the last process ended waits to be started again,
            // unless it was running at each of the last two deaths: then it waits for the user.
            if suspects.contains(info.id.rawValue), info.state == .running || info.state == .waiting {
                info.state = .paused
                info.failure = DownloadFailure(category: .interrupted, reason: CrashGuard.reason)
                held.append(DownloadRow(info: info, place: row.place, bases: configuration.pathBases))
            }
            if info.state == .running { info.state = .waiting }
            var d = DownloadDetails(info)
            if !info.state.isFinal || info.state == .failed {
                let held = Downloader.partialProgress(of: Self.request(for: d, root: configuration.root))
                d.progress = DownloadProgress(bytesDone: held?.bytesHeld ?? 0,
                                              totalBytes: held?.totalBytes ?? d.progress.totalBytes, bytesPerSecond: 0)
            }
            details[d.id] = d
            keys[Key(d.url, d.destination)] = d.id
            limiters[d.id] = RateLimiter(bytesPerSecond: d.speedLimit)
            queue.add(d.id, state: info.state, priority: info.priority, place: row.place)
        }
        sortedIDs = details.keys.sorted()
        if !held.isEmpty { store.update(held) }
        // Rows stored with whole paths inside a base (before there were bases) are stored relative
        // to it now, so that they are found after the base moves.
        if !configuration.pathBases.bases.isEmpty {
            let bases = configuration.pathBases
            try? store.rewritePaths(rows.compactMap { row in
                let portable = DownloadRow(info: row.info(bases: bases), place: row.place, bases: bases)
                return portable.destinationPath != row.destinationPath || portable.finalPath != row.finalPath ? portable : nil
            })
        }
        if configuration.autoStart {
            Task { await self.schedule() }
        }
    }

    /// A manager, opened off the caller's thread: the state directory's lock, the database and every
    /// control file are read on the blocking-I/O pool (``init(configuration:)`` does that on the
    /// calling thread). What an app calls at launch, from its main actor or any task.
    /// - Throws: as ``init(configuration:)``.
    public static func open(configuration: Configuration) async throws(PickupError) -> DownloadManager {
        do {
            return try await BlockingIO.run { try DownloadManager(configuration: configuration) }
        } catch let error as PickupError {
            throw error
        } catch {
            throw .fileSystem(configuration.stateDirectory.string, .ioError)
        }
    }

    /// Starts downloads, when the configuration said not to at once, or again after ``suspend()``
    /// (taking back the state directory's lock and database first).
    /// - Returns: false, and nothing starts, when another process took the state directory while
    ///   this manager was suspended.
    @discardableResult
    public func start() async -> Bool {
        // Starts and suspensions run one after another, each whole (see ``lifeChain``).
        let previous = lifeChain
        let task = Task { () -> Bool in
            await previous?.value
            return await self.startNow()
        }
        lifeChain = Task { _ = await task.value }
        return await task.value
    }

    func startNow() async -> Bool {
        guard !isShutDown else { return false }
        if lockFile == nil {
            let (dir, store) = (configuration.stateDirectory, store)
            let lock = try? await BlockingIO.run { () -> PartialFile? in
                let lock = try PartialFile(path: dir.appending("manager.lock"))
                guard lock.lock(within: 1) else {
                    lock.close()
                    return nil
                }
                do { try store.resume() } catch {
                    lock.close()
                    return nil
                }
                return lock
            }
            guard let lock, !isShutDown else {
                lock?.close()
                return false
            }
            lockFile = lock
        }
        started = true
        schedule()
        return true
    }

    /// Stops every transfer, each after a checkpoint, and starts none until ``start()``: what an
    /// app does when it goes to the background (call `start()` when it comes back). The downloads
    /// that were running wait in their places in the queue and resume from their checkpoints;
    /// nothing else changes. Returns once every transfer has ended and every lock is released:
    /// the partial files' (their runs have ended), the state directory's and the database's
    /// (iOS ends a suspended app that holds a file lock in a shared container). Calls meanwhile
    /// (add, pause, remove) still work: the database is opened for each and closed after.
    public func suspend() async {
        let previous = lifeChain
        let task = Task {
            await previous?.value
            await self.suspendNow()
        }
        lifeChain = task
        await task.value
    }

    func suspendNow() async {
        started = false
        let runs = running
        for id in runs.keys where stopping[id] == nil {
            stop(id, .requeue)
            moveTo(id, .waiting)
        }
        for run in runs.values { await run.task.value }
        guard !started, !isShutDown, let lock = lockFile else { return }
        lockFile = nil
        let store = store
        _ = try? await BlockingIO.run {
            store.suspend()
            lock.close()
        }
    }

    /// Stops every transfer (each checkpoints first), saves the queue, and releases the state
    /// directory. Downloads that were running are running again in the next manager. Observers'
    /// event sequences end.
    public func shutdown() async {
        guard !isShutDown else { return }
        isShutDown = true
        // A start taking the lock back, or a suspension releasing it, ends first.
        await lifeChain?.value
        ticker?.cancel()
        let runs = running
        for (id, run) in runs {
            // A transfer already being cancelled or paused ends as asked.
            if stopping[id] == nil { stopping[id] = .shutdown }
            run.task.cancel()
        }
        for run in runs.values { await run.task.value }
        await crashGuard?.clean()
        await downloader.shutdown()
        await trustedDownloader?.shutdown()
        for d in retiredDownloaders.values { await d.shutdown() }
        emitTotals()
        for o in observers.values { o.end() }
        observers = [:]
        store.close()
        lockFile?.close()
        lockFile = nil
    }

    // MARK: - Adding

    /// Adds a download and returns its id at once; it starts when a slot is free. Adding the same
    /// URL for the same destination again returns the existing download (and queues it again if it
    /// had failed, or completed but its file has since been deleted).
    /// - Throws: ``PickupError/invalidInput(_:)`` for a URL that is not http(s) or an unusable destination.
    @discardableResult
    public func add(_ url: String, to destination: Destination, priority: Int = 0, checksum: ExpectedDigest? = nil,
                    overwrite: Bool = false, speedLimit: Int64? = nil, paused: Bool = false,
                    options: RequestOptions = RequestOptions()) throws(PickupError) -> DownloadID
    {
        try add([NewDownload(url: url, to: destination, priority: priority, checksum: checksum, overwrite: overwrite,
                             speedLimit: speedLimit, paused: paused, options: options)])[0]
    }

    /// Adds many downloads in one database transaction (the fast way to queue thousands); returns
    /// their ids in the same order. Duplicates are handled as in ``add(_:to:priority:checksum:overwrite:speedLimit:paused:options:)``.
    public func add(_ items: [NewDownload]) throws(PickupError) -> [DownloadID] {
        try checkOpen()
        var ids = [DownloadID?](repeating: nil, count: items.count)
        var fresh: [(index: Int, row: DownloadRow)] = []
        var pending: [Key: Int] = [:]
        var place = queue.nextPlace
        let now = Date()
        for (i, item) in items.enumerated() {
            let destination = Self.absolute(item.destination)
            try Self.validate(item.url, destination, connections: item.connections, mirrors: item.mirrors)
            try RateLimiter.validate(item.speedLimit)
            let key = Key(item.url, destination)
            if let id = keys[key] {
                requeueIfStale(id)
                ids[i] = id
                continue
            }
            if let earlier = pending[key] {
                ids[i] = ids[earlier]
                continue
            }
            pending[key] = i
            let info = DownloadInfo(
                id: DownloadID(rawValue: 0), url: item.url, destination: destination,
                state: item.paused ? .paused : .waiting, priority: item.priority,
                progress: DownloadProgress(bytesDone: 0, totalBytes: nil, bytesPerSecond: 0), path: nil, failure: nil,
                speedLimit: item.speedLimit, checksum: item.checksum, overwrite: item.overwrite,
                connections: item.connections, addedAt: now, finishedAt: nil, options: item.options,
                mirrors: item.mirrors, pieces: item.pieces, length: item.length)
            fresh.append((i, DownloadRow(info: info, place: place, bases: configuration.pathBases)))
            place += 1
        }
        if !fresh.isEmpty {
            let rows: [DownloadRow]
            do {
                rows = try store.insert(fresh.map(\.row))
            } catch {
                throw .fileSystem("\(configuration.stateDirectory.appending("manager.sqlite")): \(error)", .ioError)
            }
            for ((index, _), row) in zip(fresh, rows) {
                let info = row.info(bases: configuration.pathBases)
                var d = DownloadDetails(info)
                let held = Downloader.partialProgress(of: Self.request(for: d, root: configuration.root))
                d.progress = DownloadProgress(bytesDone: held?.bytesHeld ?? 0, totalBytes: held?.totalBytes, bytesPerSecond: 0)
                details[d.id] = d
                insertSorted(d.id)
                keys[Key(d.url, d.destination)] = d.id
                limiters[d.id] = RateLimiter(bytesPerSecond: d.speedLimit)
                queue.add(d.id, state: info.state, priority: info.priority, place: row.place)
                ids[index] = d.id
                if let added = self.info(d.id) { emit(.added(added)) }
            }
            setChanged(newWork: true)
        }
        schedule()
        return ids.map { $0! }
    }

    /// A failed download, or a completed one whose file is gone, goes back to the queue.
    private func requeueIfStale(_ id: DownloadID) {
        guard let d = details[id], let state = state(of: id) else { return }
        let gone = state == .completed && !Self.fileIsThere(d, root: configuration.root)
        guard state == .failed || gone else { return }
        if gone { update(id) { $0.path = nil; $0.progress = DownloadProgress(bytesDone: 0, totalBytes: nil, bytesPerSecond: 0) } }
        moveTo(id, .waiting)
        setChanged(newWork: true)
    }

    // MARK: - Control

    /// Pauses a download: a waiting one will not start, a running one stops after a checkpoint.
    /// It stays paused across restarts until ``resume(_:)``.
    public func pause(_ id: DownloadID) throws(PickupError) {
        try checkKnown(id)
        guard let state = state(of: id), state == .waiting || state == .running else { return }
        if state == .running { stop(id, .pause) }
        moveTo(id, .paused)
        schedule()
    }

    /// Queues a paused or failed download again.
    public func resume(_ id: DownloadID) throws(PickupError) {
        try checkKnown(id)
        guard let state = state(of: id), state == .paused || state == .failed else { return }
        moveTo(id, .waiting)
        schedule()
    }

    /// Pauses every waiting and running download.
    public func pauseAll() {
        for (id, e) in queue.entries where e.state == .waiting || e.state == .running {
            if e.state == .running { stop(id, .pause) }
            moveTo(id, .paused)
        }
    }

    /// Queues every paused download again.
    public func resumeAll() {
        for (id, e) in queue.entries.sorted(by: { $0.key < $1.key }) where e.state == .paused { moveTo(id, .waiting) }
        schedule()
    }

    /// Cancels a download and forgets it. Its partial bytes stay (adding the same URL and
    /// destination later resumes from them) unless `deletePartial`: no call loses a download's
    /// bytes unless asked to. A completed download's file is kept: see
    /// ``remove(_:deleteFile:deletePartial:)``.
    public func cancel(_ id: DownloadID, deletePartial: Bool = false) async throws(PickupError) {
        try checkKnown(id)
        await delete(try forget(id, deletePartial: deletePartial, deleteFile: false))
    }

    /// Forgets a download. Nothing on disk is deleted unless asked:
    /// - `deleteFile`: a completed download's file is deleted (if it is still the one downloaded);
    /// - `deletePartial`: an unfinished (or failed) download's partial file is deleted, with its
    ///   control and cursor files (`NAME.pickup-part`, `.pickup-ctl`, `.pickup-pos`).
    ///
    /// Without `deletePartial` a running download is stopped after a checkpoint and its partial
    /// file stays where it was: adding the same URL and destination again, or `pickup get` of the
    /// URL into the same directory (or `-o` the same path), resumes from it.
    public func remove(_ id: DownloadID, deleteFile: Bool = false, deletePartial: Bool = false) async throws(PickupError) {
        try checkKnown(id)
        await delete(try forget(id, deletePartial: deletePartial, deleteFile: deleteFile))
    }

    /// Deletes the files of every completed download and forgets those downloads; returns how many.
    @discardableResult
    public func deleteFinishedFiles() async throws(PickupError) -> Int {
        let done = queue.entries.filter { $0.value.state == .completed }.map(\.key)
        var deletions = Deletions()
        for id in done {
            let more = try forget(id, deletePartial: false, deleteFile: true)
            deletions.work += more.work
            deletions.partials += more.partials
        }
        await delete(deletions)
        return done.count
    }

    /// Runs the deletions `forget` asked for on the blocking-I/O pool (unlink is a blocking call:
    /// never on Swift's cooperative pool), and returns once they are done. While a partial file's
    /// deletion is under way, no run of its (URL, destination) starts (``deleting``): a download
    /// added again at once would otherwise open the files being unlinked.
    private func delete(_ deletions: Deletions) async {
        guard !deletions.work.isEmpty else { return }
        let work = deletions.work
        _ = try? await BlockingIO.run { for d in work { d() } }
        deleted(deletions.partials)
    }

    /// The file deletions `forget` asks for, and the downloads whose partial files they delete
    /// (counted in ``deleting`` until they are done).
    struct Deletions {
        var work: [@Sendable () -> Void] = []
        var partials: [Key] = []
    }

    /// The partial-file deletions of these keys are done: their downloads may start again.
    private func deleted(_ done: [Key]) {
        for key in done {
            deleting[key, default: 1] -= 1
            if deleting[key] == 0 { deleting[key] = nil }
        }
        if !done.isEmpty { schedule() }
    }

    /// Forgets the download at once; returns the deletions of files it asks for (for a download
    /// not running; a running one's partial file is deleted, when asked, once its transfer ends).
    private func forget(_ id: DownloadID, deletePartial: Bool, deleteFile: Bool) throws(PickupError) -> Deletions {
        try checkOpen()
        guard let d = details[id], let state = state(of: id) else { return Deletions() }
        do {
            try store.delete([id])
        } catch {
            throw .fileSystem("\(configuration.stateDirectory.appending("manager.sqlite")): \(error)", .ioError)
        }
        var deletions = Deletions()
        let root = configuration.root
        if running[id] != nil {
            stop(id, .cancel(deletePartial: deletePartial))
        } else if deletePartial, !state.isFinal || state == .failed {
            let request = Self.request(for: d, root: root)
            deletions.work.append { Downloader.discardPartial(of: request) }
            deletions.partials.append(Key(d.url, d.destination))
            deleting[Key(d.url, d.destination), default: 0] += 1
        }
        if deleteFile, state == .completed { deletions.work.append { Self.deleteFile(of: d, root: root) } }
        details[id] = nil
        let i = sortedIndex(of: id, after: false)
        if i < sortedIDs.count, sortedIDs[i] == id { sortedIDs.remove(at: i) }
        keys[Key(d.url, d.destination)] = nil
        limiters[id] = nil
        queue.remove(id)
        emit(.removed(id))
        setChanged(newWork: true)
        schedule()
        return deletions
    }

    /// Changes a download's priority (a running download is not stopped; the order applies to
    /// those still waiting).
    public func setPriority(_ id: DownloadID, _ priority: Int) throws(PickupError) {
        try checkKnown(id)
        queue.setPriority(id, priority)
        persist(id)
        emitChanged(id)
    }

    /// Makes a waiting (or paused) download the next to start.
    public func moveToFront(_ id: DownloadID) throws(PickupError) {
        try checkKnown(id)
        guard queue.moveToFront(id) != nil else { return }
        persist(id)
        emitChanged(id)
        schedule()
    }

    /// Changes how many downloads transfer at once. Lowering it sends the running downloads the
    /// order likes least back to waiting (they resume from their checkpoint later).
    public func setMaxConcurrentDownloads(_ limit: Int) {
        maxConcurrent = max(1, limit)
        if !startsAll {
            let active = running.keys.filter { stopping[$0] == nil }
            for id in queue.overLimit(running: active, limit: maxConcurrent) {
                stop(id, .requeue)
                moveTo(id, .waiting)
            }
        }
        schedule()
    }

    /// Batch mode: start every waiting download at once, whatever the limit.
    public func setStartsAllAtOnce(_ on: Bool) {
        startsAll = on
        setMaxConcurrentDownloads(maxConcurrent)
    }

    /// FIFO or LIFO among waiting downloads of equal priority.
    public func setOrder(_ order: QueueOrder) {
        queue.setOrder(order)
    }

    /// Which proxies transfers go through from now on (transfers already running finish as they
    /// are). `trusted: false` (set by someone other than the owner): transfers that carry secrets
    /// keep the proxies the manager was configured with.
    public func setProxies(_ rules: ProxyRules, trusted: Bool = true) {
        if trusted {
            if let t = trustedDownloader {
                trustedDownloader = nil
                retire(t)
            }
        } else if trustedDownloader == nil {
            trustedDownloader = Downloader(options: engineOptions, transport: configuration.transport)
        }
        guard rules != transportOptions.proxies else { return }
        transportOptions.proxies = rules
        let old = downloader
        downloader = Downloader(options: engineOptions, transport: transportOptions)
        retire(old)
    }

    /// Shuts `old` down once the transfers running now have ended (however often the setting
    /// changes, only the engines transfers still run on stay open).
    private func retire(_ old: Downloader) {
        retiredDownloaders[ObjectIdentifier(old)] = old
        let runs = running.values.map(\.task)
        Task {
            for run in runs { await run.value }
            await old.shutdown()
            self.forgetRetired(old)
        }
    }

    private func forgetRetired(_ d: Downloader) { retiredDownloaders[ObjectIdentifier(d)] = nil }

    /// The proxies transfers go through.
    public var proxies: ProxyRules { transportOptions.proxies }

    /// The global speed limit over all downloads, bytes per second (nil: none); takes effect at once.
    public func setSpeedLimit(_ bytesPerSecond: Int64?) {
        globalLimiter.bytesPerSecond = bytesPerSecond
    }

    /// One download's speed limit (nil: none); takes effect at once, and is saved with it.
    public func setSpeedLimit(_ id: DownloadID, _ bytesPerSecond: Int64?) throws(PickupError) {
        try checkKnown(id)
        try RateLimiter.validate(bytesPerSecond)
        limiters[id]?.bytesPerSecond = bytesPerSecond
        update(id) { $0.speedLimit = bytesPerSecond }
        persist(id)
        emitChanged(id)
    }

    // MARK: - Queries

    /// Waits until a download has completed or failed and returns it (its ``DownloadInfo/path`` or
    /// its ``DownloadInfo/failure``); nil when it is removed first, is unknown, or the manager shuts
    /// down. A paused download is waited for until it is resumed and ends.
    public func outcome(of id: DownloadID) async -> DownloadInfo? {
        for await event in events() {
            switch event {
            case .snapshot(let all, _):
                guard let info = all.first(where: { $0.id == id }) else { return nil }
                if info.state.isFinal { return info }
            case .changed(let info) where info.id == id && info.state.isFinal:
                return info
            case .removed(id):
                return nil
            default:
                break
            }
        }
        return nil
    }

    /// A download by id.
    public func download(_ id: DownloadID) -> DownloadInfo? { info(id) }

    /// The downloads of a URL (one per destination).
    public func downloads(url: String) -> [DownloadInfo] {
        details.values.filter { $0.url == url }.map(\.id).sorted().compactMap { info($0) }
    }

    /// Every download, or those in one state; waiting ones in the order they will start, others by
    /// id. `offset` and `limit` take a page of that list (only the page is copied).
    public func downloads(in state: DownloadState? = nil, offset: Int = 0, limit: Int? = nil) -> [DownloadInfo] {
        let ids: [DownloadID] =
            if state == .waiting { queue.waiting }
            else if let state { queue.entries.compactMap { $0.value.state == state ? $0.key : nil }.sorted() }
            else { sortedIDs }
        return ids.dropFirst(max(0, offset)).prefix(max(0, limit ?? Int.max)).compactMap { info($0) }
    }

    /// Whether a download of this URL has completed and its file is still there, whole.
    public func isDownloaded(_ url: String) -> Bool {
        details.values.contains { $0.url == url && state(of: $0.id) == .completed && Self.fileIsThere($0, root: configuration.root) }
    }

    /// Sums over all downloads.
    public func totals() -> ManagerTotals { computeTotals() }

    /// The global speed limit.
    public var speedLimit: Int64? { globalLimiter.bytesPerSecond }

    /// The current limit on downloads transferring at once.
    public var maxConcurrentDownloads: Int { maxConcurrent }

    /// FIFO or LIFO among waiting downloads of equal priority.
    public var order: QueueOrder { queue.order }

    /// Whether every waiting download starts at once (batch mode).
    public var startsAllAtOnce: Bool { startsAll }

    /// Events: first a ``ManagerEvent/snapshot(_:_:)`` of every download, then every change as it
    /// happens, in order, until the observer stops iterating or the manager shuts down. Any number
    /// of observers may come and go; each sees a consistent picture (the snapshot and the changes
    /// after it are taken in one step).
    ///
    /// With `backlog`, an observer that falls that many events behind (a stalled network client)
    /// has its sequence ended instead of growing the manager's memory without bound: it never sees
    /// a gap, and can observe again to get a fresh snapshot.
    public func events(backlog: Int? = nil) -> AsyncStream<ManagerEvent> {
        let policy: AsyncStream<ManagerEvent>.Continuation.BufferingPolicy = backlog.map { .bufferingOldest(max(1, $0)) } ?? .unbounded
        let (stream, continuation) = AsyncStream<ManagerEvent>.makeStream(bufferingPolicy: policy)
        continuation.yield(.snapshot(downloads(), computeTotals()))
        observe(continuation) { $0.event }
        return stream
    }

    /// The changes from now on, numbered (``SequencedEvent/seq``), without a snapshot; `after` is the
    /// number of the latest event before them. With ``snapshotPage(after:limit:)`` an observer builds
    /// its picture page by page, with bounded memory however many downloads there are: a change
    /// numbered at most a page's ``SnapshotPage/seq`` is already in that page. The backlog is as in
    /// ``events(backlog:)``.
    public func changes(backlog: Int? = nil) -> (after: UInt64, stream: AsyncStream<SequencedEvent>) {
        let policy: AsyncStream<SequencedEvent>.Continuation.BufferingPolicy = backlog.map { .bufferingOldest(max(1, $0)) } ?? .unbounded
        let (stream, continuation) = AsyncStream<SequencedEvent>.makeStream(bufferingPolicy: policy)
        observe(continuation) { $0 }
        return (eventSeq, stream)
    }

    /// Up to `limit` downloads in id order after `id` (from the first with nil), as they are now,
    /// with the number of the latest event they reflect, and the totals on the last page.
    public func snapshotPage(after id: DownloadID?, limit: Int) -> SnapshotPage {
        let start = id.map { sortedIndex(of: $0, after: true) } ?? 0
        let ids = sortedIDs[start..<min(sortedIDs.count, start + max(1, limit))]
        let isLast = start + ids.count >= sortedIDs.count
        return SnapshotPage(downloads: ids.compactMap { info($0) }, isLast: isLast, seq: eventSeq,
                            totals: isLast ? computeTotals() : nil)
    }

    /// One observer: how to hand it an event (false when it fell too far behind) and end it.
    struct Observer {
        let send: @Sendable (SequencedEvent) -> Bool
        let end: @Sendable () -> Void
    }

    private func observe<T: Sendable>(_ continuation: AsyncStream<T>.Continuation, _ map: @escaping @Sendable (SequencedEvent) -> T) {
        if isShutDown {
            continuation.finish()
            return
        }
        let key = nextObserver
        nextObserver += 1
        observers[key] = Observer(
            send: { if case .dropped = continuation.yield(map($0)) { return false } else { return true } },
            end: { continuation.finish() })
        continuation.onTermination = { _ in Task { await self.removeObserver(key) } }
    }

    /// By binary search in `sortedIDs`: where `id` is or would be inserted, or with `after`, the
    /// index of the first id greater than `id`.
    func sortedIndex(of id: DownloadID, after: Bool) -> Int {
        var lo = 0, hi = sortedIDs.count
        while lo < hi {
            let mid = (lo + hi) / 2
            if sortedIDs[mid] < id || (after && sortedIDs[mid] == id) { lo = mid + 1 } else { hi = mid }
        }
        return lo
    }

    func insertSorted(_ id: DownloadID) {
        if let last = sortedIDs.last, last < id { sortedIDs.append(id); return }
        let i = sortedIndex(of: id, after: false)
        if i < sortedIDs.count, sortedIDs[i] == id { return }
        sortedIDs.insert(id, at: i)
    }

    private func removeObserver(_ key: Int) { observers[key] = nil }

    // MARK: - Running downloads

    /// Starts what the queue says may start now.
    func schedule() {
        guard started, !isShutDown else { return }
        // A download paused and resumed before its transfer ended waits for that end; so does one
        // whose URL and destination a transfer still ending holds (removed while it ran, added
        // again: the old transfer still has its partial file, and may be about to delete it).
        let ending = running.values.compactMap { keys[Key($0.request.url, $0.request.destination)] }
        let busy = Set(running.keys).union(deleting.keys.compactMap { keys[$0] }).union(ending)
        for id in queue.startNext(active: running.count, limit: startsAll ? nil : maxConcurrent, busy: busy) {
            launch(id)
        }
    }

    private func launch(_ id: DownloadID) {
        guard let d = details[id] else { return }
        // Not saved: "waiting" and "running" rows both mean "should run", and restore the same way.
        update(id) { $0.failure = nil; $0.finishedAt = nil }
        emitChanged(id)
        var request = Self.request(for: d, root: configuration.root)
        request.limiters = [globalLimiter] + (limiters[id].map { [$0] } ?? [])
        let box = NIOLockedValueBox(Reported())
        let secrets = ([request.url] + request.mirrors).contains { request.options.carriesSecrets(url: $0) }
        let downloader = secrets ? trustedDownloader ?? self.downloader : self.downloader
        let crashGuard = self.crashGuard
        let task = Task {
            await crashGuard?.running(id.rawValue)  // written before a byte of it runs
            let result: Result<DownloadResult, PickupError>
            // A path stored relative to a base this launch does not name stays relative: never run
            // under the current directory.
            let path: FilePath = switch request.destination { case .file(let p), .directory(let p): p }
            do throws(PickupError) {
                guard path.isAbsolute else {
                    throw .invalidInput("\(path) is relative to a base this launch does not name (DownloadManager.Configuration.pathBases)")
                }
                result = .success(try await downloader.download(request) { event in
                    box.withLockedValue {
                        switch event {
                        case .progress(let p): $0.progress = p
                        case .notice(let n): $0.notices.append(n)
                        }
                    }
                })
            } catch {
                result = .failure(error)
            }
            if let (deletion, key) = self.finished(id, result) {
                // Removed with its partial file while running: deleted now that nothing writes it,
                // on the blocking-I/O pool; the freed slot is given after that.
                _ = try? await BlockingIO.run(deletion)
                self.deleted([key])
            }
        }
        running[id] = Run(task: task, box: box, request: request)
        startTicker()
    }

    /// A transfer ended: record how, as its stop intent (if any) says.
    /// Returns the deletion of the partial file of a download cancelled or removed with it while
    /// it ran (for the caller to run on the blocking-I/O pool, then to schedule).
    private func finished(_ id: DownloadID, _ result: Result<DownloadResult, PickupError>) -> (@Sendable () -> Void, Key)? {
        let run = running.removeValue(forKey: id)
        let intent = stopping.removeValue(forKey: id)
        // Said once its end is recorded: a death while recording it still counts against it.
        defer { crashGuard?.ended(id.rawValue) }
        drain(id, run?.box)
        guard let d = details[id] else {
            // Cancelled or removed while running: now that nothing writes them, drop the bytes.
            if case .cancel(deletePartial: true)? = intent, case .failure = result, let run {
                let request = run.request
                let key = Key(request.url, request.destination)
                deleting[key, default: 0] += 1
                return ({ Downloader.discardPartial(of: request) }, key)
            }
            schedule()
            return nil
        }
        switch result {
        case .success(let r):
            update(id) {
                $0.path = r.path
                $0.progress = DownloadProgress(bytesDone: r.size, totalBytes: r.size, bytesPerSecond: 0)
                $0.finishedAt = Date()
                $0.failure = nil
            }
            // Even when it finished just as it was being paused or sent back: the file is done.
            queue.force(id, to: .completed)
        case .failure(let error):
            let held = Downloader.partialProgress(of: Self.request(for: d, root: configuration.root))
            update(id) {
                $0.progress = DownloadProgress(bytesDone: held?.bytesHeld ?? 0, totalBytes: held?.totalBytes ?? $0.progress.totalBytes,
                                               bytesPerSecond: 0)
            }
            if intent == nil {
                if case .interrupted = error {
                    // Stopped from outside the manager: as good as a pause.
                    queue.force(id, to: .paused)
                } else {
                    queue.force(id, to: .failed)
                    update(id) { $0.failure = DownloadFailure(error); $0.finishedAt = Date() }
                }
            }
        }
        if case .shutdown? = intent, case .failure = result {
            // Saved as running, so that the next manager resumes it.
            persist(id, state: .running)
        } else {
            persist(id)
            emitChanged(id)
        }
        setChanged()
        schedule()
        return nil
    }
}
