import HTTPTypes

/// What a request for part of a file says: its header fields, and where it ends when a range is
/// asked for in pieces.
enum RangeRequest {
    /// Where a request for `offset..<end` ends when the range is asked for in pieces (several
    /// connections over TLS, responses that may be combined: see ``FileDownload/piecewise(_:)``):
    /// each piece long enough that the round trip before the next costs about 2% of its transfer
    /// (`latency`: the quickest answer so far, ``RunState/quickestAnswer``; `rate`: the
    /// connection's bytes per second), at least ``pieceSeconds`` of it and at least
    /// ``minRequest``. A split then lands between two responses
    /// (``SegmentScheduler/Segment/requested``) instead of cutting one short, which costs its
    /// connection. Only when responses may be combined (a strong validator for If-Range; RFC 9110
    /// §15.3.7.3), so a first request, which learns that, asks for everything; one connection
    /// alone, plain HTTP and FTP, and several sources (mirrors that cap connections count a
    /// request between two pieces as a free slot another connection takes: 503s) ask for all of it.
    static func pieceEnd(offset: Int64, end: Int64, rate: Double?, latency: Double?) -> Int64 {
        let piece = max(Double(minRequest), max(pieceSeconds, 50 * (latency ?? 0)) * (rate ?? 0))
        guard piece.isFinite, piece < Double(end - offset) else { return end }
        return offset + Int64(piece)
    }

    /// The smallest piece of a range one request asks for (see ``pieceEnd(offset:end:rate:latency:)``).
    static let minRequest: Int64 = 4 << 20
    /// The least time one piece takes at its connection's speed: each response costs CPU to start
    /// (a request, a head, reads that grow again), measurable on a fast link (256 pieces per GiB
    /// on loopback cost a tenth more CPU than 16 ranges).
    static let pieceSeconds = 0.25

    /// `Range` (open-ended only while the length is unknown, otherwise exactly the range, so a
    /// finished range leaves its connection reusable and nothing is sent twice), `If-Range` when
    /// resuming, and the conditionals that ask whether a finished file changed.
    static func headers(offset: Int64, end: Int64, validators: Validators?, conditional: Validators?) -> HTTPFields {
        var headers: HTTPFields = [.range: ByteRange(first: offset, last: end == .max ? nil : end - 1).headerValue]
        if offset > 0, let ifRange = validators?.ifRange { headers[.ifRange] = ifRange }
        if let etag = conditional?.etag {
            headers[.ifNoneMatch] = etag.headerValue
        } else if let lm = conditional?.lastModified {
            headers[.ifModifiedSince] = lm
        }
        return headers
    }
}
