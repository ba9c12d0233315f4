import Atomics
import Crypto
import Foundation
import HTTPTypes
import NIOConcurrencyHelpers
import SystemPackage

/// One run of one download: find what is already held, fetch the rest over one or more
/// connections with retries, checkpoint, verify, and put the file in place by an atomic rename.
///
/// The hot path (``BodyWriter/receiveBody(_:)``) touches only atomics (a ``SegmentCursor``,
/// `transferred`, the tuner's `trial`); everything else the transport threads and the engine share is in `state`, under its lock.
final class FileDownload: @unchecked Sendable {
    let request: DownloadRequest
    let options: DownloadOptions
    let transport: any Transport
    let onEvent: @Sendable (DownloadEvent) -> Void
    let monitor: DownloadMonitor
    let store: CompletionStore
    /// The target's directory, open for the whole run: every helper file, the rename and the
    /// clean-up go through it by name (see ``DirectoryHandle``).
    let dir: DirectoryHandle
    let partialName: String
    let controlName: String
    /// The ``CursorFile``'s name.
    let cursorName: String
    var directory: FilePath { dir.path }
    var partialPath: FilePath { dir.pathOf(partialName) }

    /// Body bytes written in this run.
    let transferred = ManagedAtomic<Int64>(0)

    /// Taken around every write of the control file and every truncation of the partial file (on
    /// the blocking-I/O pool), so that they happen one at a time and in order. The data path never
    /// takes it; a thread holding it takes the state's lock only briefly, never the other way round.
    let ioLock = NIOLock()
    /// The run's state machine under its lock, reached only through it (as async-http-client's
    /// `modifyStateAndRunActions`): an event applied under the lock returns what the engine then
    /// does, outside it. Every mutable fact of the run (the control record and what is on disk,
    /// the ranges, the sources, the writers, the tuner, the search for a bad source, the cookies),
    /// changed only by its named events (``RunState``).
    let state: NIOLockedValueBox<RunState>
    /// The partial file, open and locked for the run: set once by ``prepare()``.
    var file: PartialFile? { opened.load() }
    private let opened = ManagedAtomicLazyReference<PartialFile>()

    /// While shed to one connection (``ConnectionTuner``), the others wait here.
    let restore = Gate()
    /// While the tuner tries one connection, that connection (-1: none): every other one reads
    /// nothing but a chunk per ``BodyWriter/holdPause``, its connection and response kept open.
    /// The data path's copy of `RunState.keeper` for the trial's length, as a cursor's `end` is of
    /// its range's end: written by ``tune()`` only, next to the state's event.
    let trial = ManagedAtomic(-1)
    /// Bytes that connection wrote during the trial: the speed the tuner decides on.
    let trialBytes = ManagedAtomic<Int64>(0)
    /// The user's header fields (with the URL's credentials as `Authorization`), for every request.
    let userHeaders: [RequestHeader]
    /// A checkpoint is queued or running on the blocking-I/O pool.
    let checkpointQueued = ManagedAtomic(false)
    /// A write-behind is queued or running on the pool.
    let writeBehindQueued = ManagedAtomic(false)
    /// A check of completed pieces is queued or running.
    let piecesQueued = ManagedAtomic(false)

    /// Connection `i` of this download asks for ``FetchRequest/lane`` `laneBase + i`: each keeps
    /// its own thread and socket from range to range, and downloads at once spread over the threads.
    let laneBase = FileDownload.lanes.loadThenWrappingIncrement(ordering: .relaxed)
    static let lanes = ManagedAtomic(0)

    /// What the monitor's ticks decide (``Ticks``), reached only through its lock (held for a whole
    /// tick, so that ``stopMonitoring()`` waits for one in progress).
    let ticks: NIOLockedValueBox<Ticks>

    init(request: DownloadRequest, options: DownloadOptions, transport: any Transport, monitor: DownloadMonitor? = nil,
         onEvent: @escaping @Sendable (DownloadEvent) -> Void) throws(PickupError) {
        if let length = request.length, let pieces = request.pieces, length < 0 || pieces.count(total: length) == nil {
            throw .verification(pieces.uncheckable(total: length))
        }
        self.request = request
        self.options = options
        self.transport = transport
        self.monitor = monitor ?? DownloadMonitor(interval: min(options.progressInterval, options.checkpointInterval))
        self.onEvent = onEvent
        self.store = CompletionStore(stateDirectory: options.stateDirectory ?? StateDirectory.default, bases: options.pathBases)
        let (directory, partialName, controlName) = try DownloadFiles.paths(for: request)
        self.partialName = partialName
        self.controlName = controlName
        cursorName = DownloadFiles.cursorName(control: controlName)
        dir = try DirectoryHandle.open(directory, under: request.root, create: true)
        userHeaders = RequestOptions.userHeaders(request.options.headers, for: request.url)
        ticks = NIOLockedValueBox(Ticks(progressEvery: options.progressInterval, checkpointEvery: options.checkpointInterval,
                                        writeBehindEvery: Self.writeBehindBytes))
        state = NIOLockedValueBox(RunState(record: ControlRecord.empty(url: request.url), minSplit: options.minSplitSize,
                                           sources: SourceSet(urls: [request.url] + request.mirrors, connections: options.connections),
                                           cookies: request.options.cookies))
    }

    // MARK: - The run

    /// What ``prepare()`` found: the open partial file, a finished file to ask about, or the
    /// result when there is nothing to fetch.
    struct Prepared: @unchecked Sendable {
        let file: PartialFile
        let conditional: (FilePath, CompletionRecord)?
        let early: DownloadResult?
    }

    /// The run, after ``prepare()`` (which the caller runs on the blocking-I/O pool).
    func run(_ prepared: Prepared) async throws -> DownloadResult {
        let started = Clock.monotonic()
        let (file, conditional) = (prepared.file, prepared.conditional)
        defer { file.close() }
        if let early = prepared.early { return early }

        startMonitoring()
        defer { stopMonitoring() }
        do {
            let ending = try await transferAll(file: file, conditional: conditional)
            stopMonitoring()
            switch ending {
            case .complete:
                break
            case .unchanged(let path, let rec):
                onEvent(.notice("already downloaded and unchanged on the server: \(path) (\(ByteCount.format(rec.length)))"))
                try await endWithNothingWritten(file, unchanged: true)
                return DownloadResult(outcome: .unchanged, path: path, size: rec.length, bytesTransferred: 0,
                                      resumedFrom: rec.length, elapsed: Clock.monotonic() - started)
            case .metalink(let metalink):
                // Nothing was written: no partial file stays, and the caller downloads what it describes.
                try await endWithNothingWritten(file)
                return DownloadResult(outcome: .metalink, path: partialPath.removingLastComponent(), size: 0, bytesTransferred: 0,
                                      resumedFrom: 0, elapsed: Clock.monotonic() - started, metalink: metalink)
            }
            let (path, size, digest) = try await BlockingIO.run {
                defer { self.end(file) }
                return try self.finish(file: file, previous: conditional)
            }
            return DownloadResult(outcome: .downloaded, path: path, size: size,
                                  bytesTransferred: transferred.load(ordering: .relaxed),
                                  resumedFrom: state.withLockedValue { $0.keptFromStart },
                                  elapsed: Clock.monotonic() - started, digest: digest)
        } catch {
            stopMonitoring()
            // Runs even when the task is cancelled (the pool does not look at cancellation).
            try? await BlockingIO.run {
                try? self.checkpointNow()
                self.discardPartialIfEmpty()
                self.end(file)
            }
            if error is CancellationError { throw PickupError.interrupted }
            throw error
        }
    }

    /// The end of a run that wrote nothing at the path (an unchanged file, a Metalink answer):
    /// the empty partial file and its helpers go, on the blocking-I/O pool.
    /// `unchanged`: a finished file's check said it is unchanged; the bytes other connections
    /// (mirrors) fetched meanwhile are of that file, fetched in this run (a check starts only when
    /// nothing is held): they go with the helper files.
    private func endWithNothingWritten(_ file: PartialFile, unchanged: Bool = false) async throws {
        try await BlockingIO.run {
            self.discardPartialIfEmpty(evenIfHeld: unchanged)
            self.end(file)
        }
    }

    /// The start of a run, on the blocking-I/O pool: opens and locks the partial file, loads the
    /// control file (taking back what the cursors of a killed run vouch for), or looks for a
    /// finished file to check.
    func prepare() throws -> Prepared {
        // `-o NAME` over a file that is not this URL's finished download stops here, before the
        // partial file is created or a byte fetched.
        try checkFixedTarget()
        // The partial file is opened and locked first, so that two processes never drive one download.
        let file = try PartialFile(in: dir, name: partialName)
        do {
            // (Asked again for a moment: `pickup partials` looks at the lock of each partial file.)
            guard file.lock(within: 0.2) else { throw PickupError.busy(partialPath.string) }
            // A finished file at this partial file's name (its completion record names it so, or is of
            // another URL) is not ours to truncate. (Our own partial file carries this URL's record
            // only between finishing and its rename.)
            if let finished = store.attached(to: file.fd), finished.name == partialName || finished.url != request.url {
                throw PickupError.invalidInput("\(partialPath) is a finished download, not a partial one; rename it and run again")
            }
            _ = opened.storeIfNilThenLoad(file)
            file.setExcludedFromBackup(true)
            if request.restart {
                removeControlFile()
                try file.truncate(to: 0)
            }
            var conditional: (FilePath, CompletionRecord)? = nil
            // Nothing held (also after a kill between the finishing rename and the control file's
            // removal): a finished file of this URL is checked instead of fetched again.
            let resumes = try loadControlFile(file)
            if state.withLockedValue({ $0.started() }) == 0 || !resumes {
                if let found = store.lookup(url: request.url, in: dir, name: fixedName, versions: !request.overwrite) {
                    guard let v = found.1.validators, v.canRevalidate else {
                        onEvent(.notice("already downloaded: \(found.0) (\(ByteCount.format(found.1.length)); the server gave no validator to check it against)"))
                        discardPartialIfEmpty()
                        return Prepared(file: file, conditional: nil, early: DownloadResult(
                            outcome: .unchanged, path: found.0, size: found.1.length, bytesTransferred: 0,
                            resumedFrom: found.1.length, elapsed: 0))
                    }
                    conditional = found
                }
            }
            return Prepared(file: file, conditional: conditional, early: nil)
        } catch {
            file.close()
            throw error
        }
    }

    /// A fixed name (``Destination/file(_:)``, `-o NAME`) where a file already is: refused
    /// (``PickupError/targetExists(_:)``) unless it is this URL's finished download (a completion
    /// record of this URL for it: the rerun checks it with the server as usual) or overwriting was
    /// asked for. On the blocking-I/O pool, before anything is created.
    func checkFixedTarget() throws(PickupError) {
        guard let name = fixedName, !request.overwrite, dir.exists(name) else { return }
        if store.lookup(url: request.url, in: dir, name: name, versions: false) != nil {
            state.withLockedValue { $0.fixedTargetIsOurs() }
            return
        }
        // A file Pickup finished from another URL, where this URL may answer with a Metalink
        // document describing that very file (a rerun of `get URL -o NAME`: the file's record is
        // under the document's URL for it): decided by the first answer, before a byte of it is
        // written (``targetPath(head:_:)``).
        if request.followMetalink, let fd = try? dir.openFile(name, write: false) {
            defer { try? fd.close() }
            if store.attached(to: fd) != nil { return }
        }
        throw .targetExists(dir.pathOf(name).string)
    }

    /// The name fixed by the caller (`-o`), or nil when the server or URL will name the file.
    var fixedName: String? {
        if case .file(let p) = request.destination { return p.lastComponent?.string }
        return nil
    }

    /// Loads a trustworthy control file for this URL, with what the cursors of a run killed in this
    /// boot add, as ``Recovery`` decides; returns whether there is something to resume. On the
    /// blocking-I/O pool, at the start.
    func loadControlFile(_ file: PartialFile) throws -> Bool {
        let record = ControlFile.load(controlName, in: dir)
        // The cursor file is opened (and so kept) only for a download with a control file.
        let mapped = record == nil || !options.cursorFile ? nil : CursorFile.open(cursorName, in: dir)
        let found = Recovery.Found(record: record, controlExists: record != nil || dir.exists(controlName),
                                   partialSize: (try? file.size()) ?? 0,
                                   written: record?.epoch.flatMap { mapped?.recovered(epoch: $0) })
        let durable = record?.durableBytes ?? 0
        switch Recovery.decide(found, url: request.url) {
        case .fresh:
            if dir.exists(cursorName) { dir.remove(cursorName) }
            return false
        case .anotherURL(let why) where request.followMetalink:
            // Left as it is until this URL answers: a Metalink document (a rerun of `get URL`
            // whose files are named as this path is) writes nothing here; a file discards it first.
            state.withLockedValue { $0.foundForeign(why) }
            return false
        case .startOver(let why), .anotherURL(let why):
            onEvent(.notice(why))
            discardAll()
            return false
        case .resume(let rec, let merged):
            let recovered = state.withLockedValue { state -> Checkpoints.Action? in
                state.loaded(rec)
                return merged.map { state.recovered($0) }
            }
            if let recovered { try ioLock.withLock { try perform(recovered, file: file) } }
        }
        // What the slots held is in the control file now: they start again for this run. (Here in
        // `prepare`, before any connection or checkpoint runs: the recovery's store above needs no
        // lock around its decision, and the mapping may be registered before its reset.)
        let now = state.withLockedValue { state -> ControlRecord in
            if let mapped { state.mapped(mapped) }
            return state.record
        }
        mapped?.reset(epoch: now.epoch ?? 0)
        if let notice = Recovery.resuming(now, durable: durable) { onEvent(.notice(notice)) }
        return true
    }

    /// Removes the control file and the cursor file.
    func removeControlFile() {
        ControlFile.remove(controlName, in: dir)
        dir.remove(cursorName)
        state.withLockedValue { $0.removed() }
    }

    /// Forgets the partial download: the control file goes; the open, locked partial file is emptied
    /// (unlinking it would leave this run writing to a file with no name).
    func discardAll() {
        removeControlFile()
        if let file { try? file.truncate(to: 0) } else { dir.remove(partialName) }
    }

    /// The user's fields and the matching cookies for a request to `url` (secrets only to the
    /// origin of the URL the user gave).
    /// A mirror's own credentials (in its URL) go to its origin only.
    func userFields(for url: String, source: Int = 0) -> HTTPFields {
        state.withLockedValue { fields(for: url, source: source, in: $0) }
    }

    /// ``userFields(for:source:)``, with the cookies and the sources of `state`.
    func fields(for url: String, source: Int, in state: RunState) -> HTTPFields {
        var fields = RequestOptions.fields(for: url, original: request.url, headers: userHeaders, jar: state.jar, now: Clock.wallSeconds())
        if source > 0, case let given = state.sources.sources[source].url, Origin(url) == Origin(given),
            let basic = RequestOptions.credentials(in: given), fields[.authorization] == nil, let field = basic.field
        {
            fields.append(field)
        }
        return fields
    }

    /// Keeps the cookies a response to `url` sets, for the rest of this run (along a redirect chain).
    /// Called on the transport thread with the head.
    func keepCookies(from head: ResponseHead, url: String) {
        let values = head.fields[values: .setCookie]
        guard !values.isEmpty else { return }
        state.withLockedValue { $0.keepCookies(values, from: url, now: Clock.wallSeconds()) }
    }

    /// Removes the partial file and its helpers when they hold nothing. On the blocking-I/O pool.
    func discardPartialIfEmpty(evenIfHeld: Bool = false) {
        ioLock.withLock {
            let (foreign, held) = state.withLockedValue { ($0.foreign != nil, $0.heldBytes) }
            if foreign { return }  // (another URL's, not ours to remove)
            if evenIfHeld || held == 0 {
                removeControlFile()
                dir.remove(partialName)
            }
        }
    }
}
