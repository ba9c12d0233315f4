import Foundation

extension FileDownload {
    /// Checks every piece against its hash (``DownloadRequest/pieces``) once every byte is held.
    /// Returns true when all match. A bad piece is no longer held (``cutOut(_:)``) and the source
    /// that wrote all of it (``RunState/soleWriter(of:_:)``) is counted: one that keeps sending bad
    /// pieces is rejected and named, and the next round fetches the pieces from a clean source
    /// where one has room. On the blocking-I/O pool, between rounds.
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
            let b = a + min(pieces.length, total - a)  // (no sum past the length: it may be near Int64.max)
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
        try cutOut(bad)
        return false
    }

    /// `ranges` are no longer held (``RunState/reopen(_:)``), stored before a byte is written
    /// into them; the cursor file is emptied, since its slots still cover them and must not be
    /// taken back after a kill (every other byte is in the record). Between rounds, on the pool.
    func cutOut(_ ranges: [(start: Int64, end: Int64)]) throws {
        try ioLock.withLock {
            let action = lock.withLock { () -> Checkpoints.Action in
                cursors = [:]
                return state.reopen(ranges)
            }
            try perform(action, file: nil)
            let (mapped, epoch) = lock.withLock { (cursorFile, record.epoch ?? 0) }
            mapped?.reset(epoch: epoch)
        }
    }
}

extension FileDownload {
    /// Where the search for a source whose bytes break the whole-file hash stands.
    struct BadSourceSearch {
        /// Sources to suspect in turn (the largest share first); nil until every byte's source is
        /// known (a first round fetches the bytes of unknown source again).
        var suspects: [Int]?
        /// What each source wrote in this run, over the search's rounds (a round forgets the
        /// writers of the bytes it fetches again; their earlier shares stay suspect).
        var written: [Int: [(start: Int64, end: Int64)]] = [:]
        /// The one suspended now.
        var current: Int?
        /// Those suspected already (a source that first writes while another's share is fetched
        /// again joins the end of the line).
        var tried: Set<Int> = []
    }

    /// With several sources and a whole-file hash (``DownloadRequest/checksum`` or the server's
    /// digest), checks the file once every byte is held; returns true when it matches or there is
    /// nothing to search. On a mismatch the sources that wrote bytes in this run are suspected in
    /// turn, the largest share first: the suspect is suspended, what it wrote is no longer held,
    /// and the next round fetches it from the others. The first round after which the hash
    /// matches names the bad source (rejected, and remembered in the control file). Without
    /// piece hashes this costs one share per suspect, not the whole file. On the blocking-I/O pool.
    func searchForTheBadSource(file: PartialFile) throws -> Bool {
        guard let expected = lock.withLock({ state.sources.several ? request.checksum ?? record.serverDigest : nil }) else {
            return true
        }
        try checkpointNow()
        if try Self.digest(of: file, algorithm: expected.algorithm) == expected.bytes {
            let notice = lock.withLock { () -> String? in
                preVerified = expected
                defer { search = nil }
                guard let bad = search?.current else { return nil }
                let url = DownloadURL.redacted(state.sources.sources[bad].url)
                state.onSources { $0.suspend(nil) }
                let notice = state.reject(bad, why: "its bytes did not match the \(expected.algorithm.rawValue) hash; its share was fetched from the others")
                return notice ?? "mirror \(url) sent bytes that do not match the \(expected.algorithm.rawValue) hash"
            }
            if let notice { onEvent(.notice(notice)) }
            return true
        }
        let next = lock.withLock { () -> (source: Int, ranges: [(start: Int64, end: Int64)])? in
            var s = search ?? BadSourceSearch(suspects: nil, current: nil)
            state.onSources { $0.suspend(nil) }
            if s.suspects == nil {
                let unknown = state.unattributed(total: record.totalLength ?? 0)
                if search == nil, !unknown.isEmpty {
                    // First the bytes whose source is not known, from whichever sources.
                    search = s
                    return (-1, unknown)
                }
                s.suspects = []
            }
            for w in state.writersByShare where !s.tried.contains(w) && s.suspects?.contains(w) == false { s.suspects?.append(w) }
            for source in state.sources.sources.indices {
                s.written[source] = RunState.merged((s.written[source] ?? []) + state.written(by: source))
            }
            // A suspect whose share another live source can fetch.
            guard let i = s.suspects?.firstIndex(where: { c in state.sources.live.contains { $0 != c } }) else {
                search = s
                return nil
            }
            let source = s.suspects!.remove(at: i)
            s.tried.insert(source)
            s.current = source
            search = s
            state.onSources { $0.suspend(source) }
            return (source, s.written[source] ?? [])
        }
        // Nothing left to suspect: the finish says the hash failed.
        guard let next else { return true }
        let bytes = next.ranges.reduce(Int64(0)) { sum, r in
            let (s, overflow) = sum.addingReportingOverflow(r.end - r.start)
            return overflow ? .max : s
        }
        if next.source < 0 {
            onEvent(.notice("the file does not match its \(expected.algorithm.rawValue) hash; fetching again the \(ByteCount.format(bytes)) "
                + "whose source is not known (written before a kill), to find the source that sent other bytes"))
        } else {
            let url = lock.withLock { DownloadURL.redacted(state.sources.sources[next.source].url) }
            onEvent(.notice("the file does not match its \(expected.algorithm.rawValue) hash; fetching the \(ByteCount.format(bytes)) "
                + "that \(url) sent from the other sources"))
        }
        try cutOut(next.ranges)
        return false
    }
}
