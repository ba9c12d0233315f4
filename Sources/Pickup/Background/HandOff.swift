import Foundation
import HTTPTypes
import NIOConcurrencyHelpers

/// One range of one download, asked for by a background transfer (a `URLSession` download task)
/// while the app is suspended. Its ``taskDescription`` names it to the session, which keeps it
/// across the app's launches; it holds no URL, header or credential.
public struct BackgroundChunk: Sendable, Hashable, Codable {
    /// The download.
    public let id: DownloadID
    /// The first byte asked for.
    public let start: Int64
    /// One past the last byte asked for.
    public let end: Int64

    /// A chunk.
    public init(id: DownloadID, start: Int64, end: Int64) {
        self.id = id
        self.start = start
        self.end = end
    }

    /// What a task carries to name its chunk: `pickup-chunk ID START END`.
    public var taskDescription: String { "pickup-chunk \(id.rawValue) \(start) \(end)" }

    /// The chunk a task's description names; nil for anything else (another library's task, a
    /// description changed or garbled).
    public init?(taskDescription: String) {
        let parts = taskDescription.split(separator: " ", omittingEmptySubsequences: false)
        guard parts.count == 4, parts[0] == "pickup-chunk", let id = Int64(parts[1]), let start = Int64(parts[2]),
            let end = Int64(parts[3]), start >= 0, end > start
        else { return nil }
        self.init(id: DownloadID(rawValue: id), start: start, end: end)
    }
}

/// What a background transfer asks for one chunk: the URL (without user information: credentials
/// travel as `Authorization`) and the header fields (`Range`, `If-Range` with the held bytes' strong
/// validator, the user's fields and cookies). Secret values are only ever put on the request.
public struct BackgroundRequest: Sendable {
    /// The chunk.
    public let chunk: BackgroundChunk
    /// The URL to ask.
    public let url: String
    /// The header fields, `Range` and `If-Range` first.
    public let headers: HTTPFields
}

/// What became of a chunk a background transfer brought.
public enum BackgroundLanding: Sendable, Equatable {
    /// Its bytes are in the partial file and the control file says so, durably.
    case landed(bytes: Int64)
    /// Nothing was written: the range stays for the next foreground run, which decides (the file
    /// changed, the server refused, the download is running again or gone). The reason is for the user.
    case refused(String)
}

/// The decisions of a hand-off to background transfers, as values (no I/O): which ranges to ask
/// for, whether a response's bytes may join the held ones, and the control record's segments
/// once they have.
enum HandOff {
    /// Taken around writing a landed chunk and around discarding a download's partial file (a
    /// removal while suspended), so that a landing never recreates a control file for a partial
    /// file just removed. Only blocking-I/O threads take it; nothing of a run does.
    static let files = NIOLock()

    /// Whether a record's segments tile `0..<total` with each `done` within its segment: the only
    /// shape the arithmetic here takes (a control file is checksummed, not trusted to be sane).
    static func isTiling(_ record: ControlRecord) -> Bool {
        guard let total = record.totalLength, total >= 0, !record.segments.isEmpty else { return false }
        var at: Int64 = 0
        for s in record.segments {
            guard s.start == at, let end = s.end, end >= s.start, end <= total, s.done >= 0, s.done <= end - s.start else { return false }
            at = end
        }
        return at == total
    }

    /// The bytes a record does not hold (each segment's missing tail) and no range of `excluding`
    /// covers (chunks a task of this session already asks for, maybe with other bounds: an
    /// earlier launch's plan), in chunks of at most `size`, in order.
    static func chunks(of record: ControlRecord, size: Int64, excluding: [(start: Int64, end: Int64)] = []) -> [(start: Int64, end: Int64)] {
        let size = max(1, size)
        let skip = RunState.merged(excluding)
        var out: [(start: Int64, end: Int64)] = []
        var k = 0
        for s in record.segments {
            guard let end = s.end else { return [] }
            var at = s.start + max(0, min(s.done, end - s.start))
            while at < end {
                // The first excluded range that ends after `at`.
                while k < skip.count, skip[k].end <= at { k += 1 }
                if k < skip.count, skip[k].start <= at {
                    at = min(end, skip[k].end)
                    continue
                }
                var stop = at + min(size, end - at)
                if k < skip.count { stop = min(stop, skip[k].start) }
                out.append((at, stop))
                at = stop
            }
        }
        return out
    }

    /// The precondition a chunk's request carries beside `If-Range`: `If-Match` with the entity tag
    /// (or `If-Unmodified-Since` with the date) the held bytes have. If the file changed (for a
    /// date: was modified after it; one replaced by an older file passes), a server that honours
    /// it answers 412 with no body (RFC 9110 §13.1.1, §13.1.4, evaluated before `If-Range`), where
    /// `If-Range` alone brings the whole new file to every chunk while the app sleeps (nothing
    /// cuts a background answer short then). A server that ignores it answers as `If-Range`
    /// decides, which is judged as before.
    static func precondition(ifRange: String) -> HTTPField {
        HTTPField(name: ifRange.hasPrefix("\"") ? .ifMatch : .ifUnmodifiedSince, value: ifRange)
    }

    /// The byte ranges a record holds, merged and in order.
    static func held(_ segments: [SegmentRecord]) -> [(start: Int64, end: Int64)] {
        RunState.merged(segments.compactMap { s in s.done > 0 ? (s.start, s.start + s.done) : nil })
    }

    /// Segments tiling `0..<total` that hold exactly `held` (merged, within the file): one per
    /// held range, from its start to the next one's, and a first one from 0 when the file's first
    /// bytes are not held.
    static func segments(holding held: [(start: Int64, end: Int64)], total: Int64) -> [SegmentRecord] {
        let held = RunState.merged(held.compactMap { r in
            let (s, e) = (max(0, r.start), min(total, r.end))
            return s < e ? (s, e) : nil
        })
        guard total > 0 else { return [SegmentRecord(start: 0, end: 0, done: 0)] }
        var out: [SegmentRecord] = []
        if held.first.map({ $0.start > 0 }) ?? true {
            out.append(SegmentRecord(start: 0, end: held.first?.start ?? total, done: 0))
        }
        for (i, r) in held.enumerated() {
            out.append(SegmentRecord(start: r.start, end: i + 1 < held.count ? held[i + 1].start : total, done: r.end - r.start))
        }
        return out
    }

    /// Whether the answer to the request for `start..<end` may join bytes held with `validators`
    /// of a file of `total` bytes, and where its bytes end (`bodyLength`: what the transfer
    /// brought). Only a 206 of this representation (RFC 9110 §14.2, §15.3.7: its `Content-Range`
    /// starts where asked, within the file's length, and its validators agree) is written: a 200
    /// is the whole file again (it changed, so `If-Range` failed, or the server ignores ranges),
    /// and the foreground run, not a background transfer, decides what to do about that.
    static func judge(_ head: ResponseHead, start: Int64, end: Int64, total: Int64, validators: Validators,
                      bodyLength: Int64) -> Result<Int64, Refusal> {
        let context = RequestContext(offset: start, validators: validators, totalLength: total)
        switch ResponseDecision.decide(head, context: context, now: Int64(Date().timeIntervalSince1970)) {
        case .append(let at, let last, let complete, _):
            guard at == start, last > start, last <= end, complete == total else {
                return .failure(Refusal("the answer's range \(at)-\(last) of \(complete.map(String.init) ?? "*") is not the one asked for"))
            }
            guard validators.consistent(with: head.validators) else {
                return .failure(Refusal("the file changed on the server (validators differ)"))
            }
            guard bodyLength == last - at else {
                return .failure(Refusal("the transfer brought \(bodyLength) bytes where its range has \(last - at)"))
            }
            return .success(last)
        case .replace:
            return .failure(Refusal("the server sent the whole file (\(head.status)): it changed, or it ignores ranges"))
        case .startOver(let why), .retry(_, let why), .fail(_, let why):
            return .failure(Refusal(why))
        case .redirect:
            return .failure(Refusal("redirected (\(head.status)): the foreground run follows redirects"))
        case .alreadyComplete, .notModified:
            return .failure(Refusal("unexpected answer \(head.status) to a range"))
        }
    }

    /// Why a chunk's bytes were not written.
    struct Refusal: Error, Equatable {
        let reason: String
        init(_ reason: String) { self.reason = reason }
    }
}
