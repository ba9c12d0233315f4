import Atomics
import Foundation

/// Where one range is being written: the next byte and the limit, shared between the connection
/// writing it and the engine (progress, checkpoints, splitting) through atomics.
///
/// `position` lives in the range's slot of the download's ``CursorFile`` when there is one (the
/// store that publishes a chunk is then also its record for a run after a kill), else on the heap.
final class SegmentCursor: @unchecked Sendable {
    /// Index of the range in the scheduler (0 while there is none).
    let segment: Int
    /// First byte of the range.
    let start: Int64
    /// Next byte to write; every byte in `start..<position` is written (not necessarily durable).
    let position: UnsafeAtomic<Int64>
    /// One past the last byte to write; lowered when another connection takes over the tail.
    let end: ManagedAtomic<Int64>
    /// True while a chunk is being written (from reading `end` to publishing `position`): a
    /// response that replaces every held byte waits until no other range's writer is inside one
    /// (see ``FileDownload/stopOthers(but:connection:)``), so no byte of another version lands after it.
    let writing = ManagedAtomic(false)
    /// Keeps the mapping that holds `position` alive (nil: `position` is this cursor's own).
    private let mapping: CursorFile?

    /// When this connection started on the range, and where: for its speed.
    let began: Double
    let beganAt: Int64

    init(segment: Int, start: Int64, position: Int64, end: Int64?, in file: CursorFile? = nil) {
        self.segment = segment
        self.start = start
        if let file, let slot = file.slot(segment, start: start, position: position) {
            self.position = slot
            mapping = file
        } else {
            self.position = .create(position)
            mapping = nil
        }
        self.end = ManagedAtomic(end ?? .max)
        began = Clock.monotonic()
        beganAt = position
    }

    deinit {
        if mapping == nil { position.destroy() }
    }

    /// Whether `position` is kept in a cursor file.
    var isMapped: Bool { mapping != nil }

    /// Bytes per second since this cursor was created, or nil before there is anything to measure.
    func rate(now: Double) -> Double? {
        let elapsed = now - began
        let bytes = position.load(ordering: .relaxed) - beganAt
        return elapsed > 0.05 && bytes > 0 ? Double(bytes) / elapsed : nil
    }

    /// Bytes written in this range.
    var written: Int64 { min(position.load(ordering: .acquiring), end.load(ordering: .relaxed)) - start }
}

/// Why an attempt's sink stopped reading its response before the end, as a value: decisions and
/// successes, not failures. A sink can end a response only by throwing, so the transport carries
/// it as ``SinkStopped``; the attempt (``FileDownload/fetchRange``) acts on the value.
enum SinkStop: Equatable, Sendable {
    /// The range is complete before the response is (the range was split, cut or shed).
    case rangeComplete
    /// The URL answered a download that holds nothing with a Metalink document
    /// (``DownloadRequest/followMetalink``): the body is not file content; it is read as a document.
    case metalink
    /// This source's answer is not this file's (another length, no ranges, other validators) while
    /// others are live: the source goes. `otherFile`: the answer shows another file, not a server
    /// that cannot serve it.
    case rejected(reason: String, otherFile: Bool = true)
    /// The head said all there is to know (a finished file's check answered with the same file, a
    /// range dropped when another response replaced every held byte): the body is not read.
    case nothingToRead
}

/// A sink's ``SinkStop``, on its way through the transport.
struct SinkStopped: SinkError {
    let why: SinkStop
    init(_ why: SinkStop) { self.why = why }
}

/// The sink for one attempt: decides on the response head (through ``FileDownload``) and then
/// writes the body at its offset in the partial file.
///
/// `receiveBody` is the per-chunk path: one atomic load, one `pwrite`, two atomic stores, one
/// atomic load per speed limit (a lock only when a limit is set), one load of the tuner's trial
/// (``FileDownload/trial``, and an atomic add for the one connection during a trial); no
/// allocation, no actor hop, no await.
final class BodyWriter: ResponseSink, @unchecked Sendable {
    // The transport calls this object from one thread at a time, in order (head, then body parts);
    // the engine reads `decision` only after `fetch` has returned. Cross-thread readers use the atomics.
    let download: FileDownload
    let context: RequestContext
    let file: PartialFile
    let limiters: [RateLimiter]
    /// ``DownloadOptions/maxFileSize``, or `Int64.max`.
    let maxSize: Int64
    private(set) var cursor: SegmentCursor
    private(set) var decision: ResponseDecision?
    private var writing = false
    private var offset: Int64 = 0
    private var responseEnd: Int64 = .max
    private var discarded = 0
    /// Whether the body written reached the end its head announced: a whole response (read once
    /// `fetch` returned without an error).
    var finishedResponse: Bool { writing && responseEnd != .max && offset >= responseEnd }
    /// Whether a body byte of this response arrived (a stall before one makes the next attempt more patient).
    private(set) var gotBody = false
    /// The connection this attempt runs on, and the source it asks.
    let connection: Int
    let source: Int
    /// The response's status (0 before its head).
    private(set) var status = 0
    /// Where this response's body began to be written (its bytes are `firstOffset..<cursor.position`);
    /// nil when it writes nothing.
    private(set) var firstOffset: Int64?
    /// When the request was made (this object is made just before it is sent).
    private let sent = Clock.monotonic()

    /// Bodies of redirects and errors are read and dropped, up to this many bytes.
    static let maxDiscard = 1 << 20

    /// The URL requested (for the cookies its response sets).
    let url: String

    init(download: FileDownload, context: RequestContext, file: PartialFile, cursor: SegmentCursor, url: String, connection: Int,
         source: Int = 0) {
        self.url = url
        self.connection = connection
        self.source = source
        self.download = download
        self.context = context
        self.file = file
        self.cursor = cursor
        limiters = download.request.limiters
        // A Metalink length bounds a body of no announced length too.
        maxSize = min(download.options.maxFileSize ?? .max, download.request.length ?? .max)
    }

    func tooLarge() -> PickupError {
        .server(status: nil, "the file is larger than the maximum size allowed (\(ByteCount.format(maxSize)))")
    }

    func receiveHead(_ head: ResponseHead) throws {
        download.keepCookies(from: head, url: url)
        status = head.status
        let d = ResponseDecision.decide(head, context: context, now: Clock.wallSeconds())
        decision = d
        if d == .notModified, head.status != 304 { throw SinkStopped(.nothingToRead) }
        if let expected = download.request.length, d.writes {
            try download.checkLength(of: d, expected: expected, source: source)
        }
        switch d {
        case .append(_, _, let total?, _), .replace(let total?, _):
            if total > maxSize { throw tooLarge() }
        default: break
        }
        if let (cursor, start, end) = try download.beginWriting(decision: d, head: head, context: context, cursor: cursor,
                                                                     latency: Clock.monotonic() - sent, connection: connection,
                                                                     source: source) {
            self.cursor = cursor
            offset = start
            firstOffset = start
            responseEnd = end ?? .max
            writing = true
        }
    }

    @inline(__always)
    func receiveBody(_ bytes: UnsafeRawBufferPointer) throws -> Double {
        gotBody = true
        guard writing else {
            discarded += bytes.count
            if discarded > Self.maxDiscard { throw TransportError.transient("response body to discard is too large") }
            return 0
        }
        // Sequentially consistent with ``FileDownload/stopOthers(but:connection:)``: either it sees this
        // chunk in progress and waits, or this chunk sees the end it lowered.
        let cursor = self.cursor
        cursor.writing.store(true, ordering: .sequentiallyConsistent)
        defer { cursor.writing.store(false, ordering: .releasing) }
        let limit = cursor.end.load(ordering: .sequentiallyConsistent)
        let n = Int(min(Int64(bytes.count), max(0, limit - offset)))
        if offset + Int64(n) > maxSize { throw tooLarge() }
        if n > 0 {
            do {
                try file.write(UnsafeRawBufferPointer(rebasing: bytes[0..<n]), at: offset)
            } catch {
                throw PickupError.fileSystem(file.path.string, error)
            }
            offset += Int64(n)
            cursor.position.store(offset, ordering: .releasing)
            download.transferred.wrappingIncrement(by: Int64(n), ordering: .relaxed)
        }
        if offset >= limit && limit < responseEnd { throw SinkStopped(.rangeComplete) }
        var pause = 0.0
        for limiter in limiters { pause = max(pause, limiter.take(bytes.count)) }
        let alone = download.trial.load(ordering: .relaxed)
        if alone >= 0 {
            if alone != connection {
                pause = max(pause, Self.holdPause)
            } else {
                download.trialBytes.wrappingIncrement(by: Int64(n), ordering: .relaxed)
            }
        }
        return pause
    }

    /// While the tuner tries one connection, each other one reads a chunk this often: its
    /// connection stays open (and its stall timer quiet) for a restore. (The trial's speed is
    /// the one connection's bytes alone, ``FileDownload/trialBytes``.)
    static let holdPause = 0.1
}
