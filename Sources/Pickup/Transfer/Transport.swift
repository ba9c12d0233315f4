import HTTPTypes

/// A GET to send: the URL and extra header fields (Range, If-Range, conditionals).
public struct FetchRequest: Sendable {
    /// Absolute http, https or ftp URL.
    public var url: String
    /// Header fields to add to the transport's defaults.
    public var headers: HTTPFields
    /// Requests with the same lane should run on the same thread and connection where the
    /// transport can arrange it (a connection's successive ranges then reuse its socket without
    /// handing every chunk to another thread); nil: wherever is free.
    public var lane: Int?
    /// How patient to be with a server that stalls: 0 waits the transport's stall timeout, each
    /// step doubles it, up to the transport's bound (``Transport/stallTimeout(patience:)``).
    public var patience: Int
    /// It may go as a stream of an HTTP/2 connection shared with other requests to the host, when
    /// the server offers HTTP/2 (``DownloadOptions/multiplex``); otherwise over HTTP/1.1.
    public var multiplex: Bool

    /// A request.
    public init(url: String, headers: HTTPFields = [:], lane: Int? = nil, patience: Int = 0,
                multiplex: Bool = false) {
        self.url = url
        self.headers = headers
        self.lane = lane
        self.patience = patience
        self.multiplex = multiplex
    }
}

/// Receives one response as it arrives. Calls come in order on one thread at a time; the body
/// call is the per-chunk hot path and must not allocate, hop or await.
public protocol ResponseSink: AnyObject, Sendable {
    /// The response head. Throwing aborts the transfer with that error. It may block (the engine
    /// opens, truncates and writes files here): a transport calls it where blocking is allowed,
    /// never on an event loop or Swift's cooperative pool, and delivers no body part and does not
    /// return from ``Transport/fetch(_:into:)`` before it has returned.
    func receiveHead(_ head: ResponseHead) throws
    /// A chunk of the body. Returns the seconds to wait before reading more (0: go on at once;
    /// a speed limit answers more). Throwing aborts the transfer with that error.
    func receiveBody(_ bytes: UnsafeRawBufferPointer) throws -> Double
}

/// An error a ``ResponseSink`` throws on purpose (the engine's own signals and failures): the
/// transport hands it back unchanged instead of classifying it.
public protocol SinkError: Error {}

/// How a transfer failed, as far as the transport can tell.
public enum TransportError: Error, Sendable, Equatable {
    /// Worth retrying: refused, reset, timed out, stalled, closed early.
    case transient(String)
    /// Not worth retrying: TLS verification, an unusable URL.
    case fatal(String)
    /// The server broke HTTP: a response head too large, malformed, or not complete in time.
    case protocolViolation(String)
    /// The host name could not be resolved (worth a retry or two: resolvers have bad moments).
    case unresolved(host: String)
    /// No byte arrived for this many seconds (the request's stall timeout): worth retrying, with
    /// more patience when it happens before the body or again (``FetchRequest/patience``).
    case stalled(seconds: Double)
    /// The proxy itself answered with this status instead of forwarding the request (a CONNECT
    /// refused, a 407, an error the proxy marks as its own).
    case proxyRefused(status: Int, reason: String)
    /// The server refused in words that retrying will not change (an FTP login refused, a file
    /// that is not there, a directory): said as it is.
    case refused(String)
    /// The server takes no more connections from us now (FTP's 421 "too many connections"):
    /// worth retrying; where other connections are fetching, this one leaves its range to them at
    /// once, so that the download goes on with as many connections as the server accepts.
    case busy(String)
}

/// Sends GET requests and streams their responses into a sink. The engine depends only on this,
/// so tests and other HTTP stacks can stand in for AsyncHTTPClient.
public protocol Transport: Sendable {
    /// Performs one request. Returns when the body has ended; throws ``TransportError``, an error
    /// the sink threw, or `CancellationError`. Redirects are not followed: the sink sees them.
    func fetch<Sink: ResponseSink>(_ request: FetchRequest, into sink: Sink) async throws
    /// Releases connections and threads.
    func shutdown() async
    /// Seconds without a byte before a request with this much patience counts as stalled (nil
    /// when the transport does not say).
    func stallTimeout(patience: Int) -> Double?
}

extension Transport {
    public func stallTimeout(patience: Int) -> Double? { nil }
}
