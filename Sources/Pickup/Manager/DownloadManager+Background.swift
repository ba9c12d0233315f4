import Foundation
import HTTPTypes
import SystemPackage

#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// Background transfers (see `PickupBackground`'s `BackgroundTransfers`): while the manager is
/// suspended, what is missing of its waiting downloads is asked for in chunks by a background
/// `URLSession`, and each chunk that lands is judged like any response and written into the
/// download's partial file with a durable checkpoint. The next foreground run takes the held bytes
/// from the control file as after any stop.
extension DownloadManager {
    /// The size of a background chunk: a transfer the system may run while the app sleeps, and
    /// all a kill or a failure of one can cost.
    public static let backgroundChunkSize: Int64 = 16 << 20

    /// While suspended (``suspend()``): the requests for every byte missing from the downloads that
    /// wait to run and may be handed to background transfers, in chunks of `chunkSize` bytes,
    /// less the chunks in `going` (a task already asks for them, whatever its bounds).
    ///
    /// A download goes to the background only when nothing about it needs this process: http(s),
    /// one source (mirrors stay in the foreground), no piece hashes, no secret (credentials, a
    /// secret header field, cookies), no proxy configured (a
    /// background transfer would go where the system sends it), bytes held with the complete
    /// length and a strong validator (the chunks' `If-Range`), and a server that has answered a
    /// range with a 206 (``ControlRecord/rangesServed``: one that answers ranges with the whole
    /// file would send it to every chunk while the app sleeps, where nothing cuts it); the others
    /// wait for ``start()``.
    public func backgroundRequests(chunkSize: Int64 = DownloadManager.backgroundChunkSize,
                                   going: [BackgroundChunk] = []) async -> [BackgroundRequest] {
        guard !started, !isShutDown, transportOptions.proxies.http == nil, transportOptions.proxies.https == nil,
            configuration.untrustedProxies == nil
        else { return [] }
        let candidates = queue.entries.filter { $0.value.state == .waiting }.sorted { $0.value.place < $1.value.place }
            .compactMap { entry -> DownloadDetails? in
                // Secrets (credentials, secret fields, cookies) stay in this process: a background
                // session's requests are kept on disk by the system, and follow redirects there.
                guard let d = details[entry.key], running[d.id] == nil, d.mirrors.isEmpty, d.pieces == nil,
                    !d.options.carriesSecrets(url: d.url),
                    let scheme = URL(string: d.url)?.scheme?.lowercased(), scheme == "http" || scheme == "https"
                else { return nil }
                return d
            }
        let root = configuration.root, size = max(64 << 10, chunkSize)
        let now = Int64(Date().timeIntervalSince1970)
        return (try? await BlockingIO.run { () -> [BackgroundRequest] in
            candidates.flatMap { d -> [BackgroundRequest] in
                let request = Self.request(for: d, root: root)
                guard let (directory, partial, control) = try? DownloadFiles.paths(for: request),
                    let dir = try? DirectoryHandle.open(directory, under: root, create: false), dir.exists(partial),
                    let record = ControlFile.load(control, in: dir), record.url == d.url, record.totalLength != nil,
                    let ifRange = record.validators?.ifRange, record.mirrors == nil, HandOff.isTiling(record),
                    record.rangesServed == true
                else { return [] }
                guard let url = Self.withoutUserInformation(d.url) else { return [] }
                let fields = RequestOptions.fields(for: d.url, original: d.url,
                                                   headers: RequestOptions.userHeaders(d.options.headers, for: d.url),
                                                   jar: d.options.cookies, now: now)
                let asked = going.filter { $0.id == d.id }.map { (start: $0.start, end: $0.end) }
                return HandOff.chunks(of: record, size: size, excluding: asked).map { c in
                    BackgroundRequest(chunk: BackgroundChunk(id: d.id, start: c.start, end: c.end), url: url,
                                      headers: fields + [HTTPField(name: .range, value: "bytes=\(c.start)-\(c.end - 1)"),
                                                         HTTPField(name: .ifRange, value: ifRange), HandOff.precondition(ifRange: ifRange),
                                                         HTTPField(name: .acceptEncoding, value: "identity")])
                }
            }
        }) ?? []
    }

    /// Takes a chunk a background transfer brought: the answer's `status` and `headers`, its body
    /// in the file open as `body` (only read, at positions; the caller closes it). Its bytes are
    /// written into the download's partial file at their place, made durable, and then claimed by
    /// the control file; or nothing is written (``BackgroundLanding/refused(_:)``) when the answer
    /// is not this representation's range (`If-Range` failed: the file changed; a redirect; an
    /// error), when the download is no longer waiting (paused, removed, running again), or when
    /// the manager has started again. Landings run one at a time, between ``start()`` and
    /// ``suspend()``, never beside a run of the download.
    /// `ifRange`: the `If-Range` value its request carried (the task's original request): bytes
    /// asked for another version than the one held now are refused, whatever the answer says.
    public func land(_ chunk: BackgroundChunk, status: Int, headers: [(name: String, value: String)],
                     body: FileDescriptor, ifRange: String?) async -> BackgroundLanding {
        let previous = lifeChain
        let head = ResponseHead(status: status, headers: headers)
        let task = Task { () -> BackgroundLanding in
            await previous?.value
            return await self.landNow(chunk, head: head, body: body, ifRange: ifRange)
        }
        lifeChain = Task { _ = await task.value }
        return await task.value
    }

    func landNow(_ chunk: BackgroundChunk, head: ResponseHead, body: FileDescriptor, ifRange: String?) async -> BackgroundLanding {
        guard !isShutDown else { return .refused("the manager is shut down") }
        guard !started else { return .refused("the manager is running: its own run fetches the range") }
        guard let d = details[chunk.id], state(of: chunk.id) == .waiting, running[chunk.id] == nil else {
            return .refused("download \(chunk.id) is not waiting to run")
        }
        let request = Self.request(for: d, root: configuration.root)
        let outcome: Result<(landed: Int64, held: Int64, total: Int64), HandOff.Refusal>
        do {
            outcome = try await BlockingIO.run { Self.write(chunk, head: head, body: body, ifRange: ifRange, request: request) }
        } catch {
            return .refused("could not write the chunk")
        }
        switch outcome {
        case .failure(let refusal):
            return .refused(refusal.reason)
        case .success(let r):
            guard details[chunk.id] != nil else { return .landed(bytes: r.landed) }
            let p = DownloadProgress(bytesDone: r.held, totalBytes: r.total, bytesPerSecond: 0)
            update(chunk.id) { $0.progress = p }
            emit(.progress(chunk.id, p))
            setChanged()
            return .landed(bytes: r.landed)
        }
    }

    /// Writes a chunk's bytes into the partial file and claims them in the control file
    /// (blocking). Everything goes through the download directory's handle; the body file is
    /// only read. Order: the bytes, their fsync, then the record (durable): a kill anywhere
    /// leaves a record that claims only durable bytes.
    static func write(_ chunk: BackgroundChunk, head: ResponseHead, body source: FileDescriptor, ifRange: String?, request: DownloadRequest)
        -> Result<(landed: Int64, held: Int64, total: Int64), HandOff.Refusal>
    {
        HandOff.files.withLock { writeLocked(chunk, head: head, body: source, ifRange: ifRange, request: request) }
    }

    private static func writeLocked(_ chunk: BackgroundChunk, head: ResponseHead, body source: FileDescriptor, ifRange: String?,
                                     request: DownloadRequest)
        -> Result<(landed: Int64, held: Int64, total: Int64), HandOff.Refusal>
    {
        guard let (directory, partial, control) = try? DownloadFiles.paths(for: request),
            let dir = try? DirectoryHandle.open(directory, under: request.root, create: false), dir.exists(partial),
            var record = ControlFile.load(control, in: dir), record.url == request.url,
            let total = record.totalLength, let validators = record.validators, validators.ifRange != nil,
            HandOff.isTiling(record)
        else { return .failure(HandOff.Refusal("the download's partial file or control file is gone or changed")) }
        guard chunk.end <= total else { return .failure(HandOff.Refusal("the chunk is past the file's end")) }
        guard ifRange == validators.ifRange else {
            return .failure(HandOff.Refusal("the chunk was asked for another version than the one held now"))
        }
        var st = stat()
        guard fstat(source.rawValue, &st) == 0, (st.st_mode & S_IFMT) == S_IFREG else {
            return .failure(HandOff.Refusal("the transfer's file is not a regular file"))
        }
        let end: Int64
        switch HandOff.judge(head, start: chunk.start, end: chunk.end, total: total, validators: validators,
                             bodyLength: Int64(st.st_size)) {
        case .failure(let refusal): return .failure(refusal)
        case .success(let e): end = e
        }
        do {
            let file = try PartialFile(in: dir, name: partial, create: false)
            defer { file.close() }
            // Another process's run of the same file (the CLI, an extension) holds this lock.
            guard file.lock() else { return .failure(HandOff.Refusal("another process is writing the download")) }
            var buffer = [UInt8](repeating: 0, count: 1 << 20)
            var at = chunk.start
            while at < end {
                let n = try buffer.withUnsafeMutableBytes { raw in
                    try source.read(fromAbsoluteOffset: at - chunk.start,
                                    into: UnsafeMutableRawBufferPointer(rebasing: raw[..<Int(min(Int64(raw.count), end - at))]))
                }
                guard n > 0 else { return .failure(HandOff.Refusal("the transfer's file is shorter than it said")) }
                try buffer.withUnsafeBytes { raw in try file.write(UnsafeRawBufferPointer(rebasing: raw[..<n]), at: at) }
                at += Int64(n)
            }
            try file.sync(barrier: true)
            // The cursor file's slots describe the ranges as the last run had them; the record
            // now holds what they vouched for (a suspension ends each run with a checkpoint).
            dir.remove(DownloadFiles.cursorName(control: control))
            record.segments = HandOff.segments(holding: HandOff.held(record.segments) + [(chunk.start, end)], total: total)
            try ControlFile.store(record, as: control, in: dir, barrier: true)
        } catch {
            return .failure(HandOff.Refusal("could not write the chunk: \(error)"))
        }
        return .success((end - chunk.start, record.durableBytes, total))
    }

    /// `url` without its user information (credentials go in `Authorization`, never in the URL a
    /// session keeps).
    static func withoutUserInformation(_ url: String) -> String? {
        guard var c = URLComponents(string: url) else { return nil }
        guard c.user != nil || c.password != nil else { return url }
        c.user = nil
        c.password = nil
        return c.string
    }
}
