import Foundation
import SystemPackage

/// What a ``DownloadManager`` holds of one download besides its state and priority: those only
/// its ``DownloadQueue`` holds, and a ``DownloadInfo`` is made of both when one is asked for
/// (``info(_:)``), so the two can never disagree.
struct DownloadDetails: Sendable {
    var id: DownloadID
    var url: String
    var destination: Destination
    var progress: DownloadProgress
    var path: FilePath?
    var failure: DownloadFailure?
    var speedLimit: Int64?
    var checksum: ExpectedDigest?
    var overwrite: Bool
    var connections: Int?
    var addedAt: Date
    var finishedAt: Date?
    var options: RequestOptions
    var mirrors: [String]
    var pieces: Metalink.Pieces?
    var length: Int64?

    /// What `info` says, but its state and priority.
    init(_ info: DownloadInfo) {
        id = info.id
        url = info.url
        destination = info.destination
        progress = info.progress
        path = info.path
        failure = info.failure
        speedLimit = info.speedLimit
        checksum = info.checksum
        overwrite = info.overwrite
        connections = info.connections
        addedAt = info.addedAt
        finishedAt = info.finishedAt
        options = info.options
        mirrors = info.mirrors
        pieces = info.pieces
        length = info.length
    }

    /// The download as the queue's `entry` says it is.
    func info(_ entry: DownloadQueue.Entry) -> DownloadInfo {
        DownloadInfo(id: id, url: url, destination: destination, state: entry.state, priority: entry.priority,
                     progress: progress, path: path, failure: failure, speedLimit: speedLimit, checksum: checksum,
                     overwrite: overwrite, connections: connections, addedAt: addedAt, finishedAt: finishedAt,
                     options: options, mirrors: mirrors, pieces: pieces, length: length)
    }
}
