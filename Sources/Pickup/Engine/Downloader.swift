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

    /// A downloader on AsyncHTTPClient.
    public init(options: DownloadOptions = DownloadOptions(), transport: HTTPClientTransport.Options = .init()) {
        self.options = options
        var transport = transport
        if transport.maxReadSize == nil { transport.maxReadSize = options.connections > 1 ? 65536 : 262_144 }
        self.transport = HTTPClientTransport(options: transport)
    }

    /// A downloader on any transport (tests, other HTTP stacks).
    public init(options: DownloadOptions, transport: any Transport) {
        self.options = options
        self.transport = transport
    }

    /// Downloads `request`, resuming whatever an earlier run left. Cancelling the calling task
    /// checkpoints and throws ``PickupError/interrupted``.
    /// - Throws: ``PickupError``.
    public func download(_ request: DownloadRequest, onEvent: @escaping @Sendable (DownloadEvent) -> Void = { _ in })
        async throws(PickupError) -> DownloadResult
    {
        guard let scheme = request.url.split(separator: ":", maxSplits: 1).first?.lowercased(),
            scheme == "http" || scheme == "https", request.url.contains("://")
        else {
            throw .invalidInput("not an http or https URL: \(request.url)")
        }
        do {
            let run = try FileDownload(request: request, options: options, transport: transport, onEvent: onEvent)
            return try await run.run()
        } catch let e as PickupError {
            throw e
        } catch is CancellationError {
            throw .interrupted
        } catch let e as TransportError {
            switch e {
            case .fatal(let m), .transient(let m): throw .network(m)
            }
        } catch {
            throw .network("\(error)")
        }
    }

    /// Closes connections. Call once, when done with the downloader.
    public func shutdown() async {
        await transport.shutdown()
    }
}
