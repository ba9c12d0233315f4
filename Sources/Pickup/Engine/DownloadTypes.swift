import NIOCore
import SystemPackage

/// Where a download goes.
public enum Destination: Sendable, Equatable {
    /// Exactly this path. A file already there that is not this URL's finished download (no
    /// completion record of this URL for it) stops the download with ``PickupError/targetExists(_:)``
    /// before anything is fetched, unless ``DownloadRequest/overwrite``; this URL's own finished
    /// file is checked with the server (unchanged: nothing fetched; changed: the new version goes
    /// beside it as `name (1).ext`, or over it with `overwrite`).
    case file(FilePath)
    /// Into this directory, under the name the server suggests (`Content-Disposition`), else the
    /// URL's last path segment, else `download`.
    case directory(FilePath)
}

/// One download to perform.
public struct DownloadRequest: Sendable {
    /// The http or https URL the user gave; every run starts from it (redirects are followed anew).
    public var url: String
    /// Where the file goes.
    public var destination: Destination
    /// A digest the finished file must have.
    public var checksum: ExpectedDigest?
    /// Replace an existing file at the target: for ``Destination/file(_:)`` instead of stopping
    /// with ``PickupError/targetExists(_:)``, in a ``Destination/directory(_:)`` instead of choosing
    /// a free name.
    public var overwrite: Bool
    /// Throw away any partial download and start from zero.
    public var restart: Bool
    /// Speed limits this download obeys (its own, a global one...): each is shared by all of its
    /// connections, and may be shared with other downloads.
    public var limiters: [RateLimiter]
    /// Connections for this download (1 to 32), instead of ``DownloadOptions/connections``.
    public var connections: Int?
    /// When set, the destination must lie inside this directory, and no symlink below it is ever
    /// followed: the target's directory is opened one component at a time from here, at every
    /// run (the daemon's download root).
    public var root: FilePath?
    /// Header fields and cookies to send (``RequestOptions``); credentials in the URL are sent as
    /// `Authorization: Basic` unless a header gives one.
    public var options: RequestOptions
    /// Mirrors of the same file (http, https, ftp or ftps URLs): each is its own server, with its
    /// own validators, connections and failures; all must agree on the length. Without hashes
    /// (``checksum``, ``pieces``) their bytes are trusted as far as the length and each one's
    /// validators go.
    public var mirrors: [String]
    /// Piece hashes (from a Metalink file): each piece is checked as it completes; a source that
    /// sends bad ones is dropped, and a bad piece is fetched again from another source.
    public var pieces: Metalink.Pieces?
    /// The file's length as a Metalink document gives it: a source that announces another length
    /// (or none) is not this file and is retired; with no other source the download fails
    /// (``PickupError/verification(_:)``). Piece hashes that do not cover it fail the download.
    public var length: Int64?
    /// When the URL answers with a Metalink document (`Content-Type: application/metalink4+xml`)
    /// on a download that holds nothing yet, the document is read (bounded, never saved) and the
    /// download ends with ``DownloadOutcome/metalink`` and ``DownloadResult/metalink``, for the
    /// caller to download the files it describes. Off: the document is saved like any file.
    public var followMetalink = false

    /// A request.
    public init(
        url: String, destination: Destination, checksum: ExpectedDigest? = nil, overwrite: Bool = false,
        restart: Bool = false, limiters: [RateLimiter] = [], connections: Int? = nil, root: FilePath? = nil,
        options: RequestOptions = RequestOptions(), mirrors: [String] = [], pieces: Metalink.Pieces? = nil,
        length: Int64? = nil
    ) {
        self.length = length
        self.mirrors = mirrors
        self.pieces = pieces
        self.root = root
        self.options = options
        self.connections = connections
        self.url = url
        self.destination = destination
        self.checksum = checksum
        self.overwrite = overwrite
        self.restart = restart
        self.limiters = limiters
    }
}

/// Engine settings that are not about one file.
public struct DownloadOptions: Sendable {
    /// How often durable progress is recorded, in seconds: the most a kill -9 can cost.
    public var checkpointInterval: Double = 1
    /// A mapped cursor file beside each download over 1 MiB (`NAME.pickup-pos`), where every
    /// connection's position is kept as it writes: after a kill in the same boot almost nothing is
    /// fetched again. Off: no mapping and one file fewer; a kill costs up to
    /// ``checkpointInterval`` of transfer.
    public var cursorFile = true
    /// Directories the completion index keys its records by (``PathBases``), so that a finished
    /// file is still known after its directory moved with a base (a ``DownloadManager`` gives its own).
    public var pathBases = PathBases.none
    /// How often progress is reported, in seconds.
    public var progressInterval: Double = 0.1
    /// Retry and backoff.
    public var retry = RetryPolicy()
    /// Redirects followed per request before giving up.
    public var maxRedirects = 10
    /// Allow https-to-http redirects (and, in the transport, unverified TLS).
    public var allowInsecureRedirects = false
    /// Connections per file (1...32). More open only after the first answer is a valid 206 with a
    /// strong validator and the file is large enough to split.
    public var connections = 8
    /// Go on with one connection when the others add no speed: when this process, not the
    /// network, sets the pace (its CPU time shows it busy), it sheds to one connection and brings
    /// the others back if one turns out slower (``ConnectionTuner``). Decided once per run.
    public var adaptiveConnections = true
    /// Threads the transport spreads connections over (the tuner's measure of "busy").
    var transportThreads = System.coreCount
    /// Process CPU seconds (tests stand in a busy or idle process).
    var cpuClock: @Sendable () -> Double = ProcessCPU.seconds
    /// Ranges asked for in pieces, split between responses, and no new connection for a connection
    /// whose response was cut: a split costs no TLS handshake (nil: over https only, where a
    /// connection costs one; over plain HTTP the pieces' requests cost more CPU than new TCP
    /// connections).
    public var piecewise: Bool? = nil
    /// Told each decision of the connection tuner as it is carried out (tests).
    var onTune: (@Sendable (ConnectionTuner.Action) -> Void)? = nil
    /// The tuner's ``ConnectionTuner/keepShare`` (tests: 0 keeps every shed, whatever the speeds).
    var tunerKeepShare: Double? = nil
    /// A download's first request may go as a stream of an HTTP/2 connection shared with other
    /// downloads to the same host, when the server offers HTTP/2 (by ALPN, over TLS): many small
    /// files then cost one connection and one handshake, not one each. The ranges of a file that is
    /// split go over HTTP/1.1 connections of their own (one TCP connection per range, each with its
    /// own window). Off by default; batches (`pickup get -i`) and `pickup serve` turn it on.
    public var multiplex = false
    /// No range is split into pieces smaller than this many bytes.
    public var minSplitSize: Int64 = 1 << 20
    /// The largest file accepted, in bytes (nil: no limit): a larger announced length fails at
    /// once, and a body without a length is stopped when it passes it.
    public var maxFileSize: Int64?
    /// Reserve the whole length on disk as soon as it is known, so a full disk shows at the start.
    public var preallocate = false
    /// Where completion records go when the file system has no extended attributes; nil for
    /// the platform default (``StateDirectory/default``).
    public var stateDirectory: FilePath?

    /// Default options.
    public init() {}
}

/// How a download ended well.
public enum DownloadOutcome: Sendable, Equatable {
    /// The file was downloaded (or finished from a partial download).
    case downloaded
    /// A previous download is at the target and the server says it has not changed.
    case unchanged
    /// The URL answered with a Metalink document (``DownloadRequest/followMetalink``): nothing
    /// was written; the document is ``DownloadResult/metalink``.
    case metalink
}

/// The result of a download.
public struct DownloadResult: Sendable {
    /// What happened.
    public var outcome: DownloadOutcome
    /// The final path.
    public var path: FilePath
    /// The file's size.
    public var size: Int64
    /// Body bytes received over the network in this run (including any discarded).
    public var bytesTransferred: Int64
    /// Bytes that were already on disk when this run started.
    public var resumedFrom: Int64
    /// Wall time of this run, in seconds.
    public var elapsed: Double
    /// The digest the file was verified against (`--checksum`, or one the server announced), if any.
    public var digest: ExpectedDigest? = nil
    /// The Metalink document the URL answered with (outcome ``DownloadOutcome/metalink``).
    public var metalink: Metalink? = nil
}

/// Progress of a running download.
public struct DownloadProgress: Sendable, Equatable {
    /// Bytes held (durable or written), from the start of the file.
    public var bytesDone: Int64
    /// The complete length, when known.
    public var totalBytes: Int64?
    /// Speed smoothed over the last few seconds, bytes per second.
    public var bytesPerSecond: Double
    /// Estimated seconds to finish, when the length and a speed are known.
    public var secondsLeft: Double? {
        guard let total = totalBytes, bytesPerSecond > 0 else { return nil }
        return max(0, Double(total) - Double(bytesDone)) / bytesPerSecond
    }
    /// Fraction done, when the length is known.
    public var fraction: Double? {
        guard let total = totalBytes, total > 0 else { return totalBytes == 0 ? 1 : nil }
        return min(1, Double(bytesDone) / Double(total))
    }

    /// Seconds a connection now waits for a byte before it counts as stalled, when a slow or
    /// stalling server made it more patient than the transport's stall timeout (nil otherwise).
    public var stallTimeout: Double?

    /// Connections fetching a range of the file now (0 when not known: before the length is,
    /// or outside a run).
    public var connections: Int

    /// Which speed limit holds it back, when one does (set by a ``DownloadManager``, which knows
    /// its limits; nil when the speed is the server's or the network's).
    public var limitedBy: Limit?

    /// A speed limit a download can be held to.
    public enum Limit: String, Sendable, Codable {
        /// Its own limit (``DownloadInfo/speedLimit``).
        case download
        /// The limit on every download together (``DownloadManager/Configuration/speedLimit``).
        case global
    }

    /// A progress value.
    public init(bytesDone: Int64, totalBytes: Int64?, bytesPerSecond: Double, stallTimeout: Double? = nil, connections: Int = 0,
                limitedBy: Limit? = nil) {
        self.bytesDone = bytesDone
        self.totalBytes = totalBytes
        self.bytesPerSecond = bytesPerSecond
        self.stallTimeout = stallTimeout
        self.connections = connections
        self.limitedBy = limitedBy
    }
}

/// What a running download tells its observer.
public enum DownloadEvent: Sendable {
    /// Progress, at most every ``DownloadOptions/progressInterval``.
    case progress(DownloadProgress)
    /// Something a person should know (resuming, starting over and why, a retry, a new name).
    case notice(String)

    /// What a notice says of a mirror whose answer is another file than the first URL's
    /// ("B is not the same file as A (why): ignored as a mirror").
    public static let notTheSameFile = " is not the same file as "
}
