/// What a run may take back from what an earlier run of the same download left on disk: the one
/// place where that is decided. Pure: ``FileDownload`` gathers the facts (the control file's
/// record, the partial file's size, what the cursor file vouches for) and carries out the
/// decision.
///
/// The rules (ARCHITECTURE.md, "Recovery"):
/// 1. No trustworthy control file: nothing is held. A partial file or a damaged control file
///    without one is discarded (it cannot say which representation its bytes are of).
/// 2. A control file of another URL is discarded.
/// 3. Every byte the control file claims must be inside the partial file; a range that claims
///    nothing needs no byte (the partial file is not preallocated). Else everything is discarded.
/// 4. What the cursor file vouches for (same boot, same epoch: ``CursorFile/recovered(epoch:)``)
///    is added only when all of it lies inside the partial file.
/// 5. Held bytes (claimed and recovered) are kept across runs only with a strong validator,
///    which the next request sends in `If-Range` and the response must confirm. Else everything
///    is discarded, so that bytes of two versions are never combined.
///    A record that holds no byte keeps only the download's own facts (URL, target, mirrors):
///    what it said of the file is about no byte, maybe of an older version.
/// 6. A complete file (killed while finishing) is confirmed too: its last byte is asked again
///    with `If-Range`, so that a file changed since is fetched anew, not put in place as current.
/// 7. With mirrors, a strong validator of any source will do for rule 5, and a request from held
///    bytes goes to a source with one (``RunState/beforeAttempt(_:at:holding:)``): no byte from a
///    source that cannot confirm them is taken into a range that holds bytes before one that can
///    has. Until then only such a source is retried in place (``RunState/facts(for:holding:)``).
enum Recovery {
    /// What an earlier run left.
    struct Found {
        /// The control file's record, when one loads and checks out.
        var record: ControlRecord?
        /// Whether something is at the control file's name (a damaged one when `record` is nil).
        var controlExists: Bool
        /// The partial file's size (0 when it is empty or new).
        var partialSize: Int64
        /// What the cursor file vouches for, when it belongs to this boot and the record's epoch.
        var written: [(start: Int64, end: Int64)]?
    }

    enum Decision: Equatable {
        /// Nothing to take back: a fresh start.
        case fresh
        /// Discard every held byte and helper file, and say why.
        case startOver(String)
        /// Resume from `record` (as loaded); `merged`: the ranges with what the cursors add,
        /// to be made durable (fsync, then store) before anything else; nil when they add nothing.
        case resume(ControlRecord, merged: [SegmentRecord]?)
        /// The partial download at this path is another URL's: start over (said so), unless this
        /// URL may turn out to be a Metalink document, whose files must not cost it a byte
        /// (``RunState/foreign``).
        case anotherURL(String)
    }

    /// What a run says when it resumes with `held` (the record once recovered): how much of the
    /// file, in how many ranges, and how much of it the cursors added to the `durable` bytes of
    /// the last checkpoint. Nil when nothing is held.
    static func resuming(_ held: ControlRecord, durable: Int64) -> String? {
        let bytes = held.durableBytes
        guard bytes > 0 else { return nil }
        let total = held.totalLength.map { " of \(ByteCount.format($0))" } ?? ""
        let parts = held.segments.filter { $0.done < ($0.end ?? .max) - $0.start }.count
        let since = bytes > durable ? " (\(ByteCount.format(bytes - durable)) of it written since the last checkpoint)" : ""
        return "resuming at \(ByteCount.format(bytes))\(total)" + (parts > 1 ? " in \(parts) ranges" : "") + since
    }

    static func decide(_ found: Found, url: String) -> Decision {
        guard let record = found.record else {
            if found.controlExists { return .startOver("the partial download's control file is damaged; starting over") }
            if found.partialSize > 0 { return .startOver("the partial download ended before its first checkpoint; starting over") }
            return .fresh
        }
        guard record.url == url else {
            return .anotherURL("a partial download of another URL (\(DownloadURL.redacted(record.url))) was at this path; starting over")
        }
        // A control file is input like any other: numbers past their range (a negative start, a
        // range whose end overflows, a negative length) are a damaged file, before any sum.
        guard record.totalLength.map({ $0 >= 0 }) ?? true,
            record.segments.allSatisfy({
                $0.done >= 0 && $0.start >= 0 && ($0.end.map { $0 >= 0 } ?? true) && !$0.start.addingReportingOverflow($0.done).overflow
            })
        else { return .startOver("the partial download's control file is damaged; starting over") }
        let claimed = record.segments.filter { $0.done > 0 }.map { $0.start + $0.done }.max() ?? 0
        guard found.partialSize >= claimed else {
            return .startOver("the partial file is missing or shorter than recorded; starting over")
        }
        var segments = record.segments
        if let written = found.written, written.allSatisfy({ $0.start >= 0 && $0.start <= $0.end && $0.end <= found.partialSize }) {
            segments = record.merging(written: written)
        }
        // (Ranges that overlap could sum past Int64: a damaged file too.)
        let (held, overflow) = segments.reduce((Int64(0), false)) { sum, s in
            let (next, o) = sum.0.addingReportingOverflow(s.done)
            return (next, sum.1 || o)
        }
        if overflow { return .startOver("the partial download's control file is damaged; starting over") }
        // Nothing held: what the record says of the file (validators, length, ranges, the server's
        // digest, who wrote what) is about no byte here, and may be of a version the server no
        // longer has; kept, a first answer at byte 0 (no If-Range) of another version would be
        // recorded under the old validators, and the finished file checked with them (a weak
        // validator never corrects itself). The download's own facts stay: its URL, its
        // target's name, its mirrors and their rejections.
        if held == 0 { return .resume(record.holdingNothing(rejections: true), merged: nil) }
        // With mirrors, a strong validator of any source that is not rejected will do: the run's
        // requests from held bytes go to such a source (``RunState/beforeAttempt(_:at:holding:)``).
        let strong = record.validators?.ifRange != nil
            || (record.mirrors ?? []).contains { $0.rejected == nil && $0.validators?.ifRange != nil }
        if held > 0, !strong {
            return .startOver("cannot resume safely: the server gave no strong validator (ETag or Last-Modified), so old and new bytes could be mixed; starting over")
        }
        if held > 0, held == record.totalLength, let last = segments.indices.max(by: { segments[$0].start < segments[$1].start }),
            segments[last].done > 0
        {
            segments[last].done -= 1
        }
        return .resume(record, merged: segments == record.segments ? nil : segments)
    }
}

extension ControlRecord {
    /// This download with nothing held and nothing known of the file: its URL, target, epoch and
    /// mirrors stay, with their rejections when `rejections` (a recovery that found nothing held,
    /// ``Recovery/decide(_:url:)``; a restart for a new representation forgets them too,
    /// ``RunState/restarted(_:)``).
    func holdingNothing(rejections: Bool) -> ControlRecord {
        var r = ControlRecord(url: url, target: target, validators: nil, totalLength: nil,
                              segments: [SegmentRecord(start: 0, end: nil, done: 0)], epoch: epoch)
        r.mirrors = mirrors?.map { SourceRecord(url: $0.url, rejected: rejections ? $0.rejected : nil) }
        return r
    }
}
