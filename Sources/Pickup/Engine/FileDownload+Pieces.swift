import Foundation

extension FileDownload {
    /// Checks the pieces whose every byte is durable and that were not checked yet, as the file
    /// comes in: a good one is not read again at the end, a bad one is counted against the source
    /// that sent it at once (two, and it is rejected: its connections go to the others) and is
    /// fetched again after the round. Queued by the monitor after a checkpoint; on the
    /// blocking-I/O pool, each piece read under `ioLock` (the file is not closed under it, and
    /// cut-outs and discards wait), which checkpoints and the run's end take between pieces.
    func checkCompletePieces(_ pieces: Metalink.Pieces, file: PartialFile) {
        let found = state.withLockedValue { $0.piecesToCheck(pieces) }
        guard let found, !found.todo.isEmpty else { return }
        var bad: [(start: Int64, end: Int64)] = []
        for k in found.todo {
            let (a, b) = pieces.range(k, total: found.total)
            // (A read that fails is left to the check at the end of the round, which says so.)
            let digest = ioLock.withLock { () -> [UInt8]? in
                state.withLockedValue { $0.ended } ? nil : try? file.digest(pieces.algorithm, from: a, to: b)
            }
            guard let digest else { break }
            let good = digest == pieces.hashes[k]
            // (nil: a response still writing it has not said; the next check reads it again.)
            let recorded = state.withLockedValue { $0.pieceHashed(k, good: good, start: a, end: b, generation: found.generation) }
            guard let (stored, blame) = recorded else { continue }
            // (A new generation, or the round's end taking over: nothing more is recorded.)
            guard stored else { break }
            if !good, blame { bad.append((a, b)) }
        }
        if !bad.isEmpty { blame(bad, of: found.todo.count, pieces: pieces, after: "; fetching them again once the rest is here") }
    }

    /// Counts `bad` pieces against the sources that wrote all of each (``RunState/blame(_:now:)``):
    /// one that keeps sending bad pieces is rejected and named. Says so.
    func blame(_ bad: [(start: Int64, end: Int64)], of count: Int, pieces: Metalink.Pieces, after: String) {
        let (blamed, notices, known) = state.withLockedValue { $0.blame(bad, now: Clock.monotonic()) }
        let from = blamed.isEmpty ? "" : " (sent by \(blamed.joined(separator: ", ")))"
        if !known { onEvent(.notice("\(bad.count) of \(count) pieces failed their \(pieces.algorithm.rawValue) hash\(from)\(after)")) }
        for notice in notices { onEvent(.notice(notice)) }
    }

    /// Checks every piece against its hash (``DownloadRequest/pieces``) once every byte is held
    /// (those checked as they completed are not read again). Returns true when all match. A bad
    /// piece is no longer held (``cutOut(_:)``) and the source that wrote all of it is counted
    /// (once: a piece found bad as it completed was counted then); the next round fetches the
    /// pieces from a clean source where one has room. On the blocking-I/O pool, between rounds.
    func verifyPieces(_ pieces: Metalink.Pieces, file: PartialFile) throws -> Bool {
        try checkpointNow()
        guard let total = state.withLockedValue({ $0.record.totalLength }), total > 0, pieces.length > 0 else { return true }
        guard let count = pieces.count(total: total) else {
            // Hashes are never dropped in silence: what cannot be checked is not taken as checked.
            throw PickupError.verification(pieces.uncheckable(total: total))
        }
        // (A check running as pieces complete records nothing from now on: `seal`.)
        let (bad, counted) = try ioLock.withLock { () throws -> ([(start: Int64, end: Int64)], [(start: Int64, end: Int64)]) in
            let checked = state.withLockedValue { $0.sealPieces() }
            var bad: [(start: Int64, end: Int64)] = [], counted: [(start: Int64, end: Int64)] = []
            for k in 0..<count where !checked.good.contains(k) {
                let (a, b) = pieces.range(k, total: total)
                if checked.bad.contains(k) {
                    counted.append((a, b))
                } else if try file.digest(pieces.algorithm, from: a, to: b) != pieces.hashes[k] {
                    bad.append((a, b))
                }
            }
            return (bad, counted)
        }
        if bad.isEmpty, counted.isEmpty { return true }
        if bad.isEmpty {
            onEvent(.notice("fetching again the \(counted.count) piece\(counted.count == 1 ? "" : "s") that failed their hash"))
        } else {
            blame(bad, of: count, pieces: pieces, after: "; fetching them again")
        }
        try cutOut((bad + counted).sorted { $0.start < $1.start })
        return false
    }

    /// `ranges` are no longer held (``RunState/reopen(_:)``), stored before a byte is written
    /// into them; the cursor file is emptied, since its slots still cover them and must not be
    /// taken back after a kill (every other byte is in the record). Between rounds, on the pool.
    func cutOut(_ ranges: [(start: Int64, end: Int64)]) throws {
        try ioLock.withLock {
            let (action, mapped, epoch) = state.withLockedValue { ($0.reopen(ranges), $0.cursorFile, $0.record.epoch ?? 0) }
            try perform(action, file: nil)
            mapped?.reset(epoch: epoch)
        }
    }
}

extension FileDownload {
    /// With several sources and a whole-file hash (``DownloadRequest/checksum`` or the server's
    /// digest), checks the file once every byte is held; returns true when it matches or there is
    /// nothing to search. On a mismatch the sources that wrote bytes in this run are suspected in
    /// turn, the largest share first: the suspect is suspended, what it wrote is no longer held,
    /// and the next round fetches it from the others. The first round after which the hash
    /// matches names the bad source (rejected, and remembered in the control file). Without
    /// piece hashes this costs one share per suspect, not the whole file (the decisions:
    /// ``RunState/hashMatched(_:)`` and ``RunState/hashFailed(algorithm:)``). On the blocking-I/O pool.
    func searchForTheBadSource(file: PartialFile) throws -> Bool {
        guard let expected = state.withLockedValue({ $0.sources.several ? request.checksum ?? $0.record.serverDigest : nil }) else {
            return true
        }
        try checkpointNow()
        if try file.digest(expected.algorithm) == expected.bytes {
            if let notice = state.withLockedValue({ $0.hashMatched(expected) }) { onEvent(.notice(notice)) }
            return true
        }
        // Nothing left to suspect: the finish says the hash failed.
        guard let next = state.withLockedValue({ $0.hashFailed(algorithm: expected.algorithm.rawValue) }) else { return true }
        onEvent(.notice(next.notice))
        try cutOut(next.ranges)
        return false
    }
}
