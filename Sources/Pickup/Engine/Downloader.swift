import SystemPackage

/// Downloads single files, resumably. Create one and reuse it: it owns the HTTP client.
///
/// ```swift
/// let downloader = Downloader()
/// let result = try await downloader.download(
///     DownloadRequest(url: "https://example.com/big.iso", destination: .directory("."))
/// ) { event in
///     if case .progress(let p) = event { print(p.bytesDone, p.totalBytes ?? -1) }
/// }
/// print("saved", result.path)
/// await downloader.shutdown()
/// ```
public final class Downloader: Sendable {
    let transport: any Transport
    let options: DownloadOptions
    let monitor: DownloadMonitor

    /// A downloader on AsyncHTTPClient.
    public init(options: DownloadOptions = DownloadOptions(), transport: HTTPClientTransport.Options = .init()) {
        self.options = options
        self.transport = HTTPClientTransport(options: transport)
        monitor = DownloadMonitor(interval: min(options.progressInterval, options.checkpointInterval))
    }

    /// A downloader on any transport (tests, other HTTP stacks).
    public init(options: DownloadOptions, transport: any Transport) {
        self.options = options
        self.transport = transport
        monitor = DownloadMonitor(interval: min(options.progressInterval, options.checkpointInterval))
    }

    /// Downloads `request`, resuming whatever an earlier run left. Cancelling the calling task
    /// checkpoints and throws ``PickupError/interrupted``.
    /// - Throws: ``PickupError``.
    public func download(_ request: DownloadRequest, onEvent: @escaping @Sendable (DownloadEvent) -> Void = { _ in })
        async throws(PickupError) -> DownloadResult
    {
        try DownloadURL.check(request.url)
        do {
            var options = options
            if let n = request.connections { options.connections = min(32, max(1, n)) }
            let (transport, monitor, chosen) = (self.transport, self.monitor, options)
            // Opening the directory and the files blocks: not on Swift's cooperative pool.
            let (run, prepared) = try await BlockingIO.run {
                let run = try FileDownload(request: request, options: chosen, transport: transport, monitor: monitor, onEvent: onEvent)
                return (run, try run.prepare())
            }
            return try await run.run(prepared)
        } catch let e as PickupError {
            throw e
        } catch is CancellationError {
            throw .interrupted
        } catch let e as TransportError {
            throw e.failure
        } catch {
            throw .network("\(error)")
        }
    }

    /// What an earlier, unfinished run of `request` left on disk: the bytes its control file
    /// vouches for and the complete length if known; nil when nothing is held.
    public static func partialProgress(of request: DownloadRequest) -> (bytesHeld: Int64, totalBytes: Int64?)? {
        guard let (directory, partial, control) = try? DownloadFiles.paths(for: request),
            let dir = try? DirectoryHandle.open(directory, under: request.root, create: false), dir.exists(partial),
            let record = ControlFile.load(control, in: dir), record.url == request.url
        else { return nil }
        return (record.durableBytes, record.totalLength)
    }

    /// Deletes the partial file, control file and cursor file of an unfinished download of
    /// `request` (through the directory's handle, never following a symlink). Blocking: call it
    /// off Swift's cooperative pool, and only when no run of that request is going on.
    public static func discardPartial(of request: DownloadRequest) {
        HandOff.files.withLock { discardPartialLocked(of: request) }
    }

    private static func discardPartialLocked(of request: DownloadRequest) {
        guard let (directory, partial, control) = try? DownloadFiles.paths(for: request),
            let dir = try? DirectoryHandle.open(directory, under: request.root, create: false)
        else { return }
        ControlFile.remove(control, in: dir)
        dir.remove(DownloadFiles.cursorName(control: control))
        dir.remove(partial)
    }

    /// Closes connections. Call once, when done with the downloader.
    public func shutdown() async {
        await transport.shutdown()
    }
}
