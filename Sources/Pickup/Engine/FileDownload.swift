import Atomics
import Crypto
import Foundation
import NIOConcurrencyHelpers
import SystemPackage

/// One run of one download: find what is already held, fetch the rest with retries, checkpoint,
/// verify, and put the file in place by an atomic rename.
///
/// The hot path (``BodyWriter/receiveBody(_:)``) touches only `position` and `transferred`;
/// everything else that the transport thread and the engine share is under `lock`.
final class FileDownload: @unchecked Sendable {
    let request: DownloadRequest
    let options: DownloadOptions
    let transport: any Transport
    let onEvent: @Sendable (DownloadEvent) -> Void
    let store: CompletionStore
    let directory: FilePath
    let partialPath: FilePath
    let controlPath: FilePath

    /// Next byte to write: every byte before it is written (not necessarily durable).
    let position = ManagedAtomic<Int64>(0)
    /// Body bytes written in this run.
    let transferred = ManagedAtomic<Int64>(0)

    let lock = NIOLock()
    // Guarded by `lock`.
    var record: ControlRecord
    var durable: Int64 = 0
    var file: PartialFile?
    var currentURL: String

    init(request: DownloadRequest, options: DownloadOptions, transport: any Transport,
         onEvent: @escaping @Sendable (DownloadEvent) -> Void) throws(PickupError) {
        self.request = request
        self.options = options
        self.transport = transport
        self.onEvent = onEvent
        self.store = CompletionStore(stateDirectory: options.stateDirectory ?? StateDirectory.default)
        let base: FilePath
        switch request.destination {
        case .file(let path):
            guard let name = path.lastComponent, !path.string.hasSuffix("/") else {
                throw .invalidInput("output path \(path) has no file name")
            }
            if FS.isDirectory(path) { throw .invalidInput("\(path) is a directory; use -d to download into it") }
            directory = path.removingLastComponent().isEmpty ? FilePath(".") : path.removingLastComponent()
            base = directory.appending(name.string)
        case .directory(let dir):
            directory = dir
            let key = Hex.encode(Array(SHA256.hash(data: Array(request.url.utf8)))).prefix(16)
            base = dir.appending(".pickup-\(key)")
        }
        partialPath = FilePath(base.string + ".pickup-part")
        controlPath = FilePath(base.string + ".pickup-ctl")
        record = ControlRecord(url: request.url, target: nil, validators: nil, totalLength: nil,
                               segments: [SegmentRecord(start: 0, end: nil, done: 0)])
        currentURL = request.url
    }

    // MARK: - The run

    func run() async throws -> DownloadResult {
        let started = Clock.monotonic()
        try FS.makeDirectories(directory)
        if request.restart {
            ControlFile.remove(controlPath)
            FS.remove(partialPath)
        }
        var conditional: (FilePath, CompletionRecord)? = nil
        if !loadControlFile() {
            if let found = store.lookup(url: request.url, directory: directory, name: fixedName) {
                guard let v = found.1.validators, v.canRevalidate else {
                    onEvent(.notice("already downloaded: \(found.0) (the server gave no validator to check it against)"))
                    return DownloadResult(outcome: .unchanged, path: found.0, size: found.1.length,
                                          bytesTransferred: 0, resumedFrom: found.1.length, elapsed: 0)
                }
                conditional = found
            }
        }
        let file = try PartialFile(path: partialPath)
        lock.withLock { self.file = file }
        defer { file.close() }
        let resumedFrom = position.load(ordering: .relaxed)

        let monitor = startMonitor()
        defer { monitor.cancel() }
        do {
            let unchanged = try await transferLoop(file: file, conditional: conditional)
            monitor.cancel()
            if let (path, rec) = unchanged {
                onEvent(.notice("already downloaded and unchanged on the server: \(path)"))
                discardPartialIfEmpty()
                return DownloadResult(outcome: .unchanged, path: path, size: rec.length, bytesTransferred: 0,
                                      resumedFrom: rec.length, elapsed: Clock.monotonic() - started)
            }
            let (path, size) = try finish(file: file)
            return DownloadResult(outcome: .downloaded, path: path, size: size,
                                  bytesTransferred: transferred.load(ordering: .relaxed), resumedFrom: resumedFrom,
                                  elapsed: Clock.monotonic() - started)
        } catch {
            monitor.cancel()
            try? checkpoint()
            discardPartialIfEmpty()
            if error is CancellationError { throw PickupError.interrupted }
            throw error
        }
    }

    /// The name fixed by the caller (`-o`), or nil when the server or URL will name the file.
    var fixedName: String? {
        if case .file(let p) = request.destination { return p.lastComponent?.string }
        return nil
    }

    /// Loads a trustworthy control file for this URL; returns whether there is something to resume.
    func loadControlFile() -> Bool {
        let exists = FS.exists(controlPath) || FS.exists(partialPath)
        guard let rec = ControlFile.load(controlPath) else {
            if exists {
                onEvent(.notice("the partial download's control file is missing or damaged; starting over"))
                ControlFile.remove(controlPath)
                FS.remove(partialPath)
            }
            return false
        }
        let held = rec.durableBytes
        guard rec.url == request.url, let size = FS.size(partialPath), size >= held else {
            onEvent(.notice(rec.url == request.url
                ? "the partial file is missing or shorter than recorded; starting over"
                : "a partial download of another URL (\(rec.url)) was at this path; starting over"))
            ControlFile.remove(controlPath)
            FS.remove(partialPath)
            return false
        }
        if held > 0, rec.validators?.ifRange == nil, held != rec.totalLength {
            onEvent(.notice("cannot resume safely: the server gave no strong validator (ETag or Last-Modified), so old and new bytes could be mixed; starting over"))
            ControlFile.remove(controlPath)
            FS.remove(partialPath)
            return false
        }
        record = rec
        durable = held
        position.store(held, ordering: .relaxed)
        if held > 0 {
            let total = rec.totalLength.map { " of \(ByteCount.format($0))" } ?? ""
            onEvent(.notice("resuming at \(ByteCount.format(held))\(total)"))
        }
        return true
    }

    /// Requests until every byte is held. Returns the finished file when a conditional check says
    /// it is unchanged.
    func transferLoop(file: PartialFile, conditional initial: (FilePath, CompletionRecord)?) async throws
        -> (FilePath, CompletionRecord)?
    {
        var conditional = initial
        var failuresInRow = 0
        var redirects = 0
        var triedOriginalAgain = false
        while true {
            try Task.checkCancellation()
            let (held, total, validators, target) = lock.withLock {
                (position.load(ordering: .relaxed), record.totalLength, record.validators, record.target)
            }
            if conditional == nil, let total, held == total, target != nil { return nil }
            var offset = held
            if offset > 0, validators?.ifRange == nil, total == nil {
                onEvent(.notice("the connection dropped and the server gives neither a validator nor a length, so the download must start again from zero"))
                try restartFromZero(file)
                offset = 0
            }
            let context = RequestContext(offset: offset, validators: offset > 0 ? validators : nil,
                                         totalLength: offset > 0 ? total : nil, conditional: conditional != nil)
            var headers: [(name: String, value: String)] = [("Range", ByteRange(first: offset).headerValue)]
            if offset > 0, let ifRange = validators?.ifRange { headers.append(("If-Range", ifRange)) }
            if let cv = conditional?.1.validators {
                if let etag = cv.etag {
                    headers.append(("If-None-Match", etag.headerValue))
                } else if let lm = cv.lastModified {
                    headers.append(("If-Modified-Since", lm))
                }
            }
            let sink = BodyWriter(download: self, context: context, file: file)
            let before = transferred.load(ordering: .relaxed)
            var failure: String? = nil
            var retryAfter: Int64? = nil
            do {
                try await transport.fetch(FetchRequest(url: currentURL, headers: headers), into: sink)
            } catch let e as TransportError {
                switch e {
                case .fatal(let m): throw PickupError.network(m)
                case .transient(let m): failure = m
                }
            }
            let progressed = transferred.load(ordering: .relaxed) > before
            switch sink.decision {
            case nil:
                break
            case .append?, .replace?:
                conditional = nil
                if failure == nil {
                    let (pos, total) = lock.withLock { (position.load(ordering: .relaxed), record.totalLength) }
                    if let total, pos < total {
                        failure = "the response ended after \(ByteCount.format(pos)) of \(ByteCount.format(total))"
                    } else {
                        return nil
                    }
                }
            case .alreadyComplete?:
                lock.withLock {
                    if record.totalLength == nil { record.totalLength = position.load(ordering: .relaxed) }
                }
                if lock.withLock({ record.target }) == nil { try lock.withLock { try chooseTarget(head: nil) } }
                return nil
            case .notModified?:
                return conditional
            case .startOver(let why)?:
                onEvent(.notice("\(why); starting over from zero"))
                try restartFromZero(file)
                failuresInRow += 1
                if failuresInRow > options.retry.maxAttemptsWithoutProgress {
                    throw PickupError.server(status: 206, "\(why), again after starting over")
                }
                continue
            case .redirect(let location)?:
                redirects += 1
                guard redirects <= options.maxRedirects else {
                    throw PickupError.server(status: nil, "more than \(options.maxRedirects) redirects")
                }
                currentURL = try resolveRedirect(location, from: currentURL)
                continue
            case .retry(let after, let why)?:
                failure = why
                retryAfter = after
            case .fail(let status, let why)?:
                if [403, 404, 410].contains(status), currentURL != request.url, !triedOriginalAgain {
                    triedOriginalAgain = true
                    currentURL = request.url
                    continue
                }
                throw PickupError.server(status: status, "\(why) for \(currentURL)")
            }
            guard let failure else { continue }
            failuresInRow = progressed ? 1 : failuresInRow + 1
            guard let delay = options.retry.delay(failuresInRow: failuresInRow, retryAfter: retryAfter,
                                                  jitter: Double.random(in: 0...1))
            else {
                if let retryAfter, Double(retryAfter) > options.retry.maxRetryAfter {
                    throw PickupError.server(status: 503, "\(failure); the server asks to retry after \(retryAfter) s")
                }
                throw PickupError.network("\(failure) (gave up after \(failuresInRow) attempts without progress)")
            }
            try? checkpoint()
            onEvent(.notice("\(failure); retrying in \(String(format: "%.1f", delay)) s"))
            try await Task.sleep(nanoseconds: UInt64(delay * 1e9))
        }
    }

    func resolveRedirect(_ location: String, from current: String) throws -> String {
        guard let base = URL(string: current), let next = URL(string: location, relativeTo: base)?.absoluteURL,
            let scheme = next.scheme?.lowercased(), scheme == "http" || scheme == "https"
        else { throw PickupError.server(status: nil, "unusable redirect to '\(location)'") }
        if base.scheme?.lowercased() == "https", scheme == "http", !options.allowInsecureRedirects {
            throw PickupError.server(status: nil, "refusing redirect from https to http (\(next.absoluteString)); use --insecure to allow")
        }
        return next.absoluteString
    }

    /// Drops every held byte and records that, durably, before any new byte is written.
    func restartFromZero(_ file: PartialFile) throws {
        try lock.withLock {
            try file.truncate(to: 0)
            position.store(0, ordering: .relaxed)
            durable = 0
            record.validators = nil
            record.totalLength = nil
            record.serverDigest = nil
            record.segments = [SegmentRecord(start: 0, end: nil, done: 0)]
            try ControlFile.store(record, at: controlPath)
        }
    }

    // MARK: - Called from the transport thread

    /// Applies a decision on a response head. Returns the offset to write the body at, or nil when
    /// the body is not file content.
    func beginWriting(decision: ResponseDecision, head: ResponseHead, context: RequestContext) throws -> Int64? {
        try lock.withLock {
            guard let file else { return nil }
            switch decision {
            case .append(let at, let end, let total, let validators):
                if at > 0 { try file.sync() }
                durable = at
                record.validators = validators
                record.totalLength = total
                record.segments = [SegmentRecord(start: 0, end: total, done: at)]
                _ = end
                if record.serverDigest == nil || at == 0 { record.serverDigest = Self.serverDigest(head) }
            case .replace(let total, let validators):
                if context.offset > 0 {
                    onEvent(.notice("the server sent the whole file (200) instead of the rest; the held bytes are discarded"))
                }
                try file.truncate(to: 0)
                durable = 0
                record.validators = validators
                record.totalLength = total
                record.segments = [SegmentRecord(start: 0, end: total, done: 0)]
                record.serverDigest = Self.serverDigest(head)
            default:
                return nil
            }
            if record.target == nil || context.conditional { try chooseTarget(head: head) }
            position.store(durable, ordering: .relaxed)
            try ControlFile.store(record, at: controlPath)
            return durable
        }
    }

    static func serverDigest(_ head: ResponseHead) -> ExpectedDigest? {
        DigestHeader.expected(reprDigest: head.combined("Repr-Digest"), digest: head.combined("Digest"))
    }

    // MARK: - Checkpoints and progress

    /// Makes written bytes durable, then records them: data first, control file second.
    func checkpoint() throws {
        try lock.withLock {
            guard let file else { return }
            let pos = position.load(ordering: .acquiring)
            guard pos != durable else { return }
            try file.sync()
            durable = pos
            record.segments[0].done = pos
            try ControlFile.store(record, at: controlPath)
        }
    }

    func startMonitor() -> Task<Void, Never> {
        let interval = options.progressInterval
        let every = max(1, Int((options.checkpointInterval / interval).rounded()))
        return Task { [self] in
            var meter = SpeedMeter()
            var tick = 0
            while !Task.isCancelled {
                try? await Task.sleep(nanoseconds: UInt64(interval * 1e9))
                if Task.isCancelled { break }
                tick += 1
                let (pos, total) = lock.withLock { (position.load(ordering: .relaxed), record.totalLength) }
                let speed = meter.add(time: Clock.monotonic(), bytes: transferred.load(ordering: .relaxed))
                onEvent(.progress(DownloadProgress(bytesDone: pos, totalBytes: total, bytesPerSecond: speed)))
                if tick % every == 0 { try? checkpoint() }
            }
        }
    }

    func discardPartialIfEmpty() {
        lock.withLock {
            if position.load(ordering: .relaxed) == 0 {
                ControlFile.remove(controlPath)
                FS.remove(partialPath)
            }
        }
    }
}

