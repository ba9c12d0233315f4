import Foundation
import SystemPackage

/// Identifies one download of a ``DownloadManager``; stable across restarts.
public struct DownloadID: Hashable, Comparable, Sendable, Codable, CustomStringConvertible {
    /// The row id in the manager's database.
    public let rawValue: Int64
    /// An id from its raw value (as printed or stored by an app).
    public init(rawValue: Int64) { self.rawValue = rawValue }
    public var description: String { String(rawValue) }
    public static func < (a: DownloadID, b: DownloadID) -> Bool { a.rawValue < b.rawValue }
}

/// Where a download is in its life.
public enum DownloadState: String, Sendable, Codable, CaseIterable {
    /// Queued, to start when a slot is free (also: was running when the last process ended).
    case waiting
    /// Transferring (or retrying) now.
    case running
    /// Stopped by the user; stays so across restarts until resumed.
    case paused
    /// Finished and verified; ``DownloadInfo/path`` holds the file.
    case completed
    /// Gave up; ``DownloadInfo/failure`` says why. Resume to retry.
    case failed

    /// Whether the download will not move again by itself.
    public var isFinal: Bool { self == .completed || self == .failed }
}

/// Which waiting download of equal priority starts first.
public enum QueueOrder: String, Sendable, Codable {
    /// The one added first.
    case fifo
    /// The one added last.
    case lifo
}

/// Why a download failed: the kind of failure (as ``PickupError/Category``) and a readable reason.
public struct DownloadFailure: Error, Sendable, Equatable, CustomStringConvertible {
    /// The kind of failure.
    public var category: PickupError.Category
    /// One line for a person.
    public var reason: String

    /// A failure.
    public init(category: PickupError.Category, reason: String) {
        self.category = category
        self.reason = reason
    }

    /// The failure of an engine error.
    public init(_ error: PickupError) {
        self.init(category: error.category, reason: error.description)
    }

    public var description: String { reason }
}

/// Everything known about one download of a ``DownloadManager``.
public struct DownloadInfo: Sendable, Equatable, Identifiable {
    /// Its id.
    public var id: DownloadID
    /// The URL as added.
    public var url: String
    /// Where it goes.
    public var destination: Destination
    /// Where it is in its life.
    public var state: DownloadState
    /// Higher starts first.
    public var priority: Int
    /// Bytes held, total when known, smoothed speed and time left (speed is 0 unless running).
    public var progress: DownloadProgress
    /// The final file, once completed.
    public var path: FilePath?
    /// Why it failed, when it did.
    public var failure: DownloadFailure?
    /// Its own speed limit in bytes per second, if any (the manager's global limit applies too).
    public var speedLimit: Int64?
    /// The digest the finished file must have, if given.
    public var checksum: ExpectedDigest?
    /// Replace an existing file at the target instead of choosing a free name.
    public var overwrite: Bool
    /// Its own number of connections, if any (else the engine's setting).
    public var connections: Int?
    /// When it was added.
    public var addedAt: Date
    /// When it completed or failed.
    public var finishedAt: Date?
    /// Header fields and cookies it sends (kept in the manager's database, readable by the owner
    /// only; show ``RequestOptions/redacted``, never the values of secrets).
    public var options = RequestOptions()
    /// Mirrors of the same file (``DownloadRequest/mirrors``).
    public var mirrors: [String] = []
    /// Piece hashes (``DownloadRequest/pieces``).
    public var pieces: Metalink.Pieces? = nil
    /// The file's length from a Metalink document (``DownloadRequest/length``).
    public var length: Int64? = nil
}

/// Sums over every download of a manager.
public struct ManagerTotals: Sendable, Equatable {
    /// Downloads in each state.
    public var counts: [DownloadState: Int] = [:]
    /// Bytes held, over all downloads.
    public var bytesDone: Int64 = 0
    /// Sum of the lengths known so far.
    public var totalBytes: Int64 = 0
    /// Sum of the running downloads' speeds, bytes per second.
    public var bytesPerSecond: Double = 0
    /// Fraction of the known bytes that are done, never lower than the last one reported while
    /// the set of downloads stays the same (a length becoming known does not make it jump back).
    public var fraction: Double?
    /// Bytes done of the downloads whose length is known.
    var knownBytesDone: Int64 = 0
    /// Estimated seconds until every download with a known length is done, at the current speed.
    public var secondsLeft: Double? {
        guard bytesPerSecond > 0, totalBytes > 0 else { return nil }
        return Double(max(0, totalBytes - knownBytesDone)) / bytesPerSecond
    }

    /// Number of downloads in `state`.
    public func count(_ state: DownloadState) -> Int { counts[state, default: 0] }
}

/// What a ``DownloadManager`` tells an observer of ``DownloadManager/events()``.
public enum ManagerEvent: Sendable {
    /// First event of every observation: every download as it is now, and the totals.
    case snapshot([DownloadInfo], ManagerTotals)
    /// A download was added.
    case added(DownloadInfo)
    /// A download changed state, priority or options: started, paused, resumed, completed (its
    /// ``DownloadInfo/path`` is the file), failed (its ``DownloadInfo/failure`` says why).
    case changed(DownloadInfo)
    /// Progress of a running download, at most every ``DownloadManager/Configuration/progressInterval``.
    case progress(DownloadID, DownloadProgress)
    /// The manager's totals, after a batch of progress or changes.
    case totals(ManagerTotals)
    /// Something a person should know about a download (resuming, starting over and why, a retry).
    case notice(DownloadID, String)
    /// A download was cancelled or removed.
    case removed(DownloadID)
}

/// A ``ManagerEvent`` with its number: events are numbered from 1 in the order they are sent.
public struct SequencedEvent: Sendable {
    /// The event's number.
    public var seq: UInt64
    /// The event.
    public var event: ManagerEvent

    /// The download it is about, if one.
    public var download: DownloadID? {
        switch event {
        case .added(let i), .changed(let i): i.id
        case .progress(let id, _), .notice(let id, _), .removed(let id): id
        case .snapshot, .totals: nil
        }
    }
}

/// A page of a ``DownloadManager``'s downloads, in id order (``DownloadManager/snapshotPage(after:limit:)``).
public struct SnapshotPage: Sendable {
    /// The downloads, as they are after event number `seq`.
    public var downloads: [DownloadInfo]
    /// Whether no download follows this page.
    public var isLast: Bool
    /// The number of the latest event these downloads reflect.
    public var seq: UInt64
    /// The totals, as of `seq` (on the last page only).
    public var totals: ManagerTotals?
}

/// A download to add to a ``DownloadManager``: the URL, where it goes, and its options.
public struct NewDownload: Sendable {
    /// The http or https URL.
    public var url: String
    /// Where the file goes (a relative path is taken from the current directory at the time of adding).
    public var destination: Destination
    /// Higher starts first (default 0).
    public var priority: Int
    /// A digest the finished file must have.
    public var checksum: ExpectedDigest?
    /// Replace an existing file at the target instead of choosing a free name.
    public var overwrite: Bool
    /// Its own speed limit in bytes per second (the manager's global limit applies too).
    public var speedLimit: Int64?
    /// Add it paused: it waits for ``DownloadManager/resume(_:)``.
    public var paused: Bool
    /// Connections for this download, 1 to 32 (nil: the engine's setting).
    public var connections: Int?
    /// Header fields and cookies to send (kept across restarts).
    public var options: RequestOptions
    /// Mirrors of the same file (``DownloadRequest/mirrors``; kept across restarts).
    public var mirrors: [String]
    /// Piece hashes, from a Metalink file (kept across restarts).
    public var pieces: Metalink.Pieces?
    /// The file's length, from a Metalink file (``DownloadRequest/length``; kept across restarts).
    public var length: Int64?

    /// A download to add.
    public init(url: String, to destination: Destination, priority: Int = 0, checksum: ExpectedDigest? = nil,
                overwrite: Bool = false, speedLimit: Int64? = nil, paused: Bool = false, connections: Int? = nil,
                options: RequestOptions = RequestOptions(), mirrors: [String] = [], pieces: Metalink.Pieces? = nil,
                length: Int64? = nil) {
        self.length = length
        self.mirrors = mirrors
        self.pieces = pieces
        self.options = options
        self.connections = connections
        self.url = url
        self.destination = destination
        self.priority = priority
        self.checksum = checksum
        self.overwrite = overwrite
        self.speedLimit = speedLimit
        self.paused = paused
    }
}
