import Foundation

extension FileDownload {
    /// Checks every piece against its hash (``DownloadRequest/pieces``) once every byte is held.
    /// Returns true when all match. A bad piece is no longer held (its ranges are cut around it
    /// and stored) and each source that sent bytes of it in this run is counted: one that keeps
    /// sending bad pieces is rejected and named, and the next round fetches the pieces from
    /// another source where one is clean. On the blocking-I/O pool, between rounds.
    func verifyPieces(_ pieces: Metalink.Pieces, file: PartialFile) throws -> Bool {
        try checkpointNow()
        guard let total = lock.withLock({ record.totalLength }), total > 0, pieces.length > 0 else { return true }
        let count = total / pieces.length + (total % pieces.length > 0 ? 1 : 0)
        guard count == Int64(pieces.hashes.count) else {
            onEvent(.notice("the piece hashes describe another length than the file's \(total) bytes; pieces are not checked"))
            return true
        }
        var bad: [(start: Int64, end: Int64)] = []
        for (k, expected) in pieces.hashes.enumerated() {
            let a = Int64(k) * pieces.length
            let b = min(total, a + pieces.length)
            if try Self.digest(of: file, algorithm: pieces.algorithm, from: a, to: b) != expected { bad.append((a, b)) }
        }
        if bad.isEmpty { return true }
        let (blamed, notices) = lock.withLock { () -> ([String], [String]) in
            var blamed = Set<Int>(), notices: [String] = []
            for (a, b) in bad {
                guard let s = state.soleWriter(of: a, b) else { continue }
                blamed.insert(s)
                if state.onSources({ $0.badPiece(s) }),
                    let notice = state.reject(s, why: "\(state.sources.sources[s].badPieces) pieces it sent failed their hash")
                {
                    notices.append(notice)
                }
            }
            return (blamed.sorted().map { DownloadURL.redacted(state.sources.sources[$0].url) }, notices)
        }
        let from = blamed.isEmpty ? "" : " (sent by \(blamed.joined(separator: ", ")))"
        onEvent(.notice("\(bad.count) of \(count) pieces failed their \(pieces.algorithm.rawValue) hash\(from); fetching them again"))
        for notice in notices { onEvent(.notice(notice)) }
        try ioLock.withLock {
            let action = lock.withLock { () -> Checkpoints.Action in
                cursors = [:]
                return state.reopen(bad)
            }
            try perform(action, file: nil)
            // Every slot's bytes are in the record now; slots that still cover a bad piece must not
            // be taken back after a kill.
            let (mapped, epoch) = lock.withLock { (cursorFile, record.epoch ?? 0) }
            mapped?.reset(epoch: epoch)
        }
        return false
    }
}
