/// Which byte ranges of the file exist, which connection fetches which, and how to split them:
/// a value-type state machine with no I/O, driven by ``FileDownload``.
///
/// Ranges never overlap and together cover `0..<total`. A connection that runs out of work takes
/// over half of the largest remaining range (dynamic splitting), so one slow connection cannot hold
/// the download hostage; a failing connection gives its range back for others to take.
public struct SegmentScheduler: Sendable, Equatable {
    /// One range and its progress.
    public struct Segment: Sendable, Equatable {
        /// First byte.
        public var start: Int64
        /// One past the last byte; shrinks when another connection takes over the tail.
        public var end: Int64
        /// Bytes written from `start` on, as last reported.
        public var done: Int64
        /// The connection fetching it, if any.
        public var owner: Int?
        /// Where the response its connection is reading ends (nil: none known, or one open to the
        /// end). A split lands there when what lies beyond is worth taking: the response then
        /// completes instead of being cut, and its connection stays open for the next request.
        public var requested: Int64?

        /// Next byte to fetch.
        public var next: Int64 { start + done }
        /// Bytes still to fetch.
        public var remaining: Int64 { max(0, end - next) }
    }

    /// How long a range's connection has gone without progress, and how fast it went before.
    public struct Quiet: Sendable, Equatable {
        /// Seconds since its last progress.
        public var seconds: Double
        /// Its speed since it started on the range, bytes per second.
        public var rate: Double
        /// Seconds a new request takes to answer (the download's latest).
        public var latency: Double

        public init(seconds: Double, rate: Double, latency: Double) {
            self.seconds = seconds
            self.rate = rate
            self.latency = latency
        }

        /// How long a range with `remaining` bytes may go without progress before the endgame
        /// takes it: twice what its rest should take at its speed, and twice what a new request
        /// takes to answer, so that taking it over is worth a request.
        public func stallTime(remaining: Int64) -> Double {
            max(2 * latency, rate > 0 ? 2 * Double(remaining) / rate : .infinity)
        }

        /// Whether a range with `remaining` bytes has stalled.
        public func stalled(remaining: Int64) -> Bool { seconds >= stallTime(remaining: remaining) }
    }

    /// What a connection should do next.
    public struct Assignment: Sendable, Equatable {
        /// The segment (index into ``segments``, stable for the download's life).
        public var segment: Int
        /// When the range was taken from another segment: that segment and its new end.
        public var shrunk: (segment: Int, end: Int64)?

        public static func == (a: Assignment, b: Assignment) -> Bool {
            a.segment == b.segment && a.shrunk?.segment == b.shrunk?.segment && a.shrunk?.end == b.shrunk?.end
        }
    }

    /// The complete length.
    public let total: Int64
    /// No range is split into pieces smaller than this.
    public let minSplit: Int64
    /// The ranges, in creation order (indices are stable).
    public private(set) var segments: [Segment]

    /// A scheduler over `records` (from a control file or a first response).
    public init(total: Int64, records: [SegmentRecord], minSplit: Int64) {
        self.total = total
        self.minSplit = max(1, minSplit)
        segments = records.map { Segment(start: $0.start, end: $0.end ?? total, done: $0.done, owner: nil) }
        if segments.isEmpty { segments = [Segment(start: 0, end: total, done: 0, owner: nil)] }
    }

    /// True when every byte is fetched.
    public var isComplete: Bool { segments.allSatisfy { $0.remaining == 0 } }

    /// Bytes fetched in all ranges.
    public var doneBytes: Int64 { segments.reduce(0) { $0 + min($1.done, $1.end - $1.start) } }

    /// The records to store in the control file.
    public var records: [SegmentRecord] {
        segments.map { SegmentRecord(start: $0.start, end: $0.end, done: min($0.done, $0.end - $0.start)) }
    }

    /// Whether a range with bytes left has no connection.
    public var hasUnowned: Bool { segments.contains { $0.owner == nil && $0.remaining > 0 } }

    /// Connections with a range.
    public var activeConnections: Int { segments.filter { $0.owner != nil && $0.remaining > 0 }.count }

    /// Gives `segment` to `connection` (the first connection takes the range it already asked for).
    public mutating func claim(_ segment: Int, by connection: Int) {
        segments[segment].owner = connection
    }

    /// The next range for a connection that has none: an unowned unfinished range, else the tail of
    /// the range that would finish last. Nil when nothing is left worth splitting.
    ///
    /// With measured speeds (bytes per second by segment, and the thief's expected speed) the split
    /// point lets both finish at the same moment, so a slow connection keeps only what it can fetch
    /// in the time the thief needs for the rest; without them the remaining range is halved.
    /// `connections` is how many connections the download runs: those out of work, and those that
    /// will be before the victim finishes, share what is taken from a slow connection.
    ///
    /// Endgame: when nothing is worth splitting, a range that has stalled (see ``Quiet``) is taken
    /// whole, however small. A server that paces a connection in bursts (nginx's `limit_rate`)
    /// otherwise leaves the last few kilobytes of a range waiting for its next burst while every
    /// other connection is idle.
    public mutating func next(
        for connection: Int, rates: [Int: Double] = [:], thiefRate: Double? = nil, connections: Int = 1,
        quiet: [Int: Quiet] = [:]
    ) -> Assignment? {
        release(connection)
        if let i = segments.indices.filter({ segments[$0].owner == nil && segments[$0].remaining > 0 })
            .max(by: { segments[$0].remaining < segments[$1].remaining })
        {
            segments[i].owner = connection
            return Assignment(segment: i, shrunk: nil)
        }
        func finishTime(_ i: Int) -> Double {
            guard let r = rates[i], r > 0 else { return Double(segments[i].remaining) / (thiefRate ?? 1) }
            return Double(segments[i].remaining) / r
        }
        guard let victim = segments.indices.filter({ segments[$0].owner != nil && segments[$0].remaining > 0 })
            .max(by: { finishTime($0) < finishTime($1) })
        else { return nil }
        let v = segments[victim]
        var keep = v.remaining / 2
        if let vr = rates[victim], vr > 0, let tr = thiefRate, tr > 0 {
            let victimTime = finishTime(victim)
            let busy = segments.indices.filter { segments[$0].owner != nil && segments[$0].owner != connection && segments[$0].remaining > 0 }
            let freeSoon = busy.filter { $0 != victim && finishTime($0) < victimTime / 2 }.count
            let helpers = max(1, connections - busy.count) + freeSoon
            keep = Int64(Double(v.remaining) * vr / (vr + tr * Double(helpers)))
            // A sliver is not worth waiting for on a slow connection: take it all. Of a larger
            // range the victim keeps a minimum piece: what is already on its way to it (socket
            // buffers: megabytes on a fast link) is then written, not fetched a second time.
            if keep < minSplit { keep = v.remaining < 2 * minSplit ? 0 : minSplit }
        }
        keep = keepingResponse(victim, keep: keep)
        // The thief takes at least one minimum piece; a very slow victim may keep next to nothing.
        guard v.remaining - keep >= minSplit else { return takeStalled(for: connection, quiet: quiet) }
        return split(victim, keeping: keep, for: connection)
    }

    /// `keep` raised to the end of the response range `i` is reading, when at least a minimum piece
    /// lies beyond it: a split there ends no response early (a cut HTTP/1 response costs its
    /// connection, and the victim's next range a new TCP and TLS handshake).
    private func keepingResponse(_ i: Int, keep: Int64) -> Int64 {
        let s = segments[i]
        guard let r = s.requested, r > s.next + keep, s.end - r >= minSplit else { return keep }
        return r - s.next
    }

    /// Range `segment`'s connection reads a response that ends at `end` (nil: open or unknown).
    public mutating func requesting(_ segment: Int, upTo end: Int64?) {
        guard segments.indices.contains(segment) else { return }
        segments[segment].requested = end
    }

    /// The tail of `victim` from `keep` bytes past its next byte goes to `connection`.
    private mutating func split(_ victim: Int, keeping keep: Int64, for connection: Int) -> Assignment {
        let v = segments[victim]
        let mid = v.next + keep
        segments[victim].end = mid
        if let r = v.requested, r > mid { segments[victim].requested = nil }
        segments.append(Segment(start: mid, end: v.end, done: 0, owner: connection))
        return Assignment(segment: segments.count - 1, shrunk: (victim, mid))
    }

    /// The endgame of ``next(for:rates:thiefRate:connections:quiet:)``: the rest of the range that
    /// has stalled longest, if one has stalled long enough.
    private mutating func takeStalled(for connection: Int, quiet: [Int: Quiet]) -> Assignment? {
        let stalled = segments.indices.filter { i in
            let s = segments[i]
            guard s.owner != nil, s.owner != connection, s.remaining > 0, let q = quiet[i] else { return false }
            return q.stalled(remaining: s.remaining)
        }
        guard let victim = stalled.max(by: { quiet[$0]!.seconds < quiet[$1]!.seconds }) else { return nil }
        return split(victim, keeping: 0, for: connection)
    }

    /// Splits the work left so that up to `connections` ranges can run at once (the initial plan):
    /// each range with bytes left gets parts in proportion to what it has left (a part at a time
    /// to the range whose parts are largest among those that can still take one, no part under a
    /// minimum piece), and is cut into that
    /// many equal parts. Equal parts finish together: halving the largest range again and again
    /// leaves ranges twice as long as others for any count but a power of two (6 connections: four
    /// of 6 MiB and two of 12 in 48 MiB), and their ends are then fetched by splits, each costing
    /// a cut response (its connection, over TLS a handshake). The first part of a range keeps its
    /// response's end (``keepingResponse(_:keep:)``) when a minimum piece lies beyond it.
    public mutating func plan(connections: Int) {
        let live = segments.indices.filter { segments[$0].remaining > 0 }
        guard !live.isEmpty, live.count < connections else { return }
        var parts = [Int](repeating: 1, count: segments.count)
        for _ in live.count..<connections {
            // (Compared as remaining₁ / parts₁ < remaining₂ / parts₂, multiplied out in Double.)
            guard let i = live.filter({ segments[$0].remaining / Int64(parts[$0] + 1) >= minSplit })
                .max(by: { Double(segments[$0].remaining) * Double(parts[$1]) < Double(segments[$1].remaining) * Double(parts[$0]) })
            else { break }
            parts[i] += 1
        }
        for i in live where parts[i] > 1 { divide(i, into: parts[i]) }
    }

    /// Cuts range `i`'s bytes left into `k` parts as equal as whole bytes allow, the first staying
    /// range `i`, the others new unowned ranges; none shorter than a minimum piece.
    private mutating func divide(_ i: Int, into k: Int) {
        let s = segments[i]
        let first = s.next + keepingResponse(i, keep: s.remaining / Int64(k))
        let rest = s.end - first
        // (The first part may have kept its response's end: the others share what is left.)
        let n = min(Int64(k - 1), rest / minSplit)
        guard n > 0 else { return }
        segments[i].end = first
        if let r = s.requested, r > first { segments[i].requested = nil }
        let (piece, extra) = (rest / n, rest % n)
        for j in 0..<n {
            let a = first + piece * j + min(j, extra)
            let b = j == n - 1 ? s.end : first + piece * (j + 1) + min(j + 1, extra)
            segments.append(Segment(start: a, end: b, done: 0, owner: nil))
        }
    }

    /// Goes on with one connection: every range another connection owns ends where the response
    /// it reads ends (else at its reported progress), and the rest of it becomes an unowned range:
    /// its connection stays open, idle, for the connections to come back on. The connection that keeps its range
    /// is the fastest by `rates` (bytes per second by segment), else the one with the most work
    /// left. Returns it (nil when no connection owns a range). The ends lowered are the ranges'
    /// own (``segments``): their writers read them from there (`RunState.end(ofRange:startingAt:)`).
    @discardableResult
    public mutating func shed(rates: [Int: Double] = [:]) -> Int? {
        guard let keep = fastest(rates: rates) else { return nil }
        for i in segments.indices where i != keep && segments[i].owner != nil && segments[i].remaining > 0 {
            cutAtProgress(i, finishingResponse: true)
        }
        return segments[keep].owner
    }

    /// The range a shed keeps: of the owned ranges with bytes left, the fastest writer's
    /// (`rates`, by range), the one with the most left among equals.
    public func fastest(rates: [Int: Double] = [:]) -> Int? {
        segments.indices.filter { segments[$0].owner != nil && segments[$0].remaining > 0 }.max(by: {
            (rates[$0] ?? 0, segments[$0].remaining) < (rates[$1] ?? 0, segments[$1].remaining)
        })
    }

    /// Every range `owners` are writing ends at its reported progress, and the rest of it becomes
    /// an unowned range (their source was rejected: others fetch the rest).
    public mutating func cut(owners: Set<Int>) {
        for i in segments.indices where segments[i].owner.map(owners.contains) == true && segments[i].remaining > 0 {
            cutAtProgress(i)
        }
    }

    /// Range `i` ends at its progress, or, `finishingResponse`, where the response it reads ends
    /// (which keeps the connection open), and the rest becomes an unowned range.
    private mutating func cutAtProgress(_ i: Int, finishingResponse: Bool = false) {
        let s = segments[i]
        var at = s.next
        if finishingResponse, let r = s.requested, r > at, r < s.end { at = r }
        segments[i].end = at
        segments.append(Segment(start: at, end: s.end, done: 0, owner: nil))
    }

    /// Records progress of a range (bytes written from its start).
    public mutating func report(_ segment: Int, done: Int64) {
        guard segments.indices.contains(segment) else { return }
        segments[segment].done = max(segments[segment].done, min(done, segments[segment].end - segments[segment].start))
    }

    /// The connection stops (finished, failed or retired): its unfinished range is free to take.
    public mutating func release(_ connection: Int) {
        for i in segments.indices where segments[i].owner == connection {
            segments[i].owner = nil
            segments[i].requested = nil
        }
    }
}
