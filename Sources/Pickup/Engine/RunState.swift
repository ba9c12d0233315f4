/// One run's state, as one value: what the control file claims and what is on disk
/// (``Checkpoints``), the ranges and who fetches them (``SegmentScheduler``), and what the run
/// has observed (where each range's writer was last seen, which connection goes on alone, what
/// was kept from the start), the writers, the tuner, the search for a bad source. No system
/// calls: ``FileDownload`` keeps it in a `NIOLockedValueBox` (its `state`, reached only through the lock), feeds it events and carries out the actions
/// it returns (stores, fsyncs, truncations, the target's name, waking connections) outside it. It
/// does hold references to the I/O edge's memory, the writers' cursors (atomics, some in the
/// mapped cursor file): it creates them, lowers their ends and samples them, so a copy of the
/// value shares them.
///
/// One fact, one owner: the ranges' shape is the scheduler's; the control record's ranges are its
/// projection, rewritten by every change that goes through ``ranges(_:)``, and their durable
/// counts are raised only by a store (``stored(_:version:)``), which also tells the scheduler.
/// What the writers have written lives in their cursors (atomics in the mapped cursor file, the
/// data path's): the state keeps the cursors (``cursors``), lowers their ends to the ranges'
/// whenever the ranges change, and reads them only as samples (``writers(now:)``) that the
/// decisions take as values.
struct RunState {
    /// The control file: the record (durable counts only) and what the file on disk claims.
    private(set) var checkpoints: Checkpoints
    /// The ranges, once the complete length is known. Whenever they change, every writer's end
    /// follows (``lowerEnds()``): the data path's copy of a range's end is kept in step here only.
    private(set) var scheduler: SegmentScheduler? {
        didSet { lowerEnds() }
    }
    /// No range is split smaller than this.
    let minSplit: Int64
    /// Where each range's writer was last seen and since when (by range): how long it has
    /// stalled, for the scheduler's endgame.
    private(set) var lastSeen: [Int: (position: Int64, since: Double)] = [:]
    /// Which connections fetch: every one, or one for a while (the tuner's), or one for good.
    enum Connections: Equatable {
        /// Every connection the options allow.
        case all
        /// The tuner's trial or shed (``ConnectionTuner``): `keeper` goes on, the others wait
        /// with their ranges (held) or without (shed), until ``connectionsRestored()``.
        case shed(keeper: Int)
        /// For the rest of the run, one connection fetches (responses disagreed on the file's
        /// validators: a load balancer whose backends have their own, say). Not undone by a
        /// restart, nor by the tuner.
        case alone(Int)

        /// The one connection that fetches, if only one does.
        var only: Int? {
            switch self {
            case .all: nil
            case .shed(let k), .alone(let k): k
            }
        }
    }
    /// Which connections fetch now.
    private(set) var connections = Connections.all
    /// The connection the tuner's trial or shed keeps (nil when none is, or one fetches for good).
    var keeper: Int? { if case .shed(let k) = connections { k } else { nil } }
    /// The connection that fetches for the rest of the run, if responses made it so.
    var alone: Int? { if case .alone(let k) = connections { k } else { nil } }
    /// How patient each connection is with stalls (``FetchRequest/patience``), and which have stalled.
    private(set) var patience: [Int: Int] = [:]
    var stalledBefore: Set<Int> = []
    /// Whether this round's first valid 206 has decided on more connections.
    private(set) var connectionsDecided = false
    /// Bytes held at the start that were kept (zero once they had to be discarded).
    private(set) var keptFromStart: Int64 = 0 {
        didSet { heldConfirmed = keptFromStart == 0 }
    }
    /// Whether a response has confirmed the bytes held at the start (by `If-Range`), or none were held.
    private(set) var heldConfirmed = true
    /// Seconds from sending the latest request to its response head: what a new request costs.
    private(set) var latency: Double?
    /// The quickest answer of the run, in seconds (the round trip on an open connection, without
    /// a connection's handshakes): what one more request costs.
    private(set) var quickestAnswer: Double?

    // MARK: Events from outside (each one named: no field is written from outside)

    /// The run starts holding what it holds now (kept from an earlier run, not yet confirmed by
    /// a response); returns those bytes.
    mutating func started() -> Int64 {
        keptFromStart = heldBytes
        return keptFromStart
    }

    /// A round of connections starts: the first valid 206 decides again on more (told through
    /// `wake`), and every source takes connections afresh (``SourceSet/newRound(connections:)``).
    mutating func newRound(connections: Int, wake: AsyncStream<Void>.Continuation? = nil) {
        connectionsDecided = false
        self.wake = wake
        sources.newRound(connections: connections)
    }

    /// The round's way to open more connections: told once the first response allows them (an
    /// I/O handle the state hands out, never calls).
    private(set) var wake: AsyncStream<Void>.Continuation?

    /// An fsync of the partial file failed: the kernel may have dropped the bytes it could not
    /// write (and a later fsync would not say so), so nothing written since the last durable
    /// checkpoint may ever be claimed. The run ends with this error (exit 6), keeping what was
    /// durable before; no attempt starts and nothing is stored after it.
    private(set) var syncFailure: PickupError?

    /// An fsync of the partial file failed with `error` (the first failure is kept).
    mutating func syncFailed(_ error: PickupError) { syncFailure = syncFailure ?? error }

    /// Rounds of connections this run started again (``roundEnded(_:maxRestarts:connections:)``).
    private(set) var restarts = 0

    /// Why a round of connections ended without the file.
    enum RoundEnd: Equatable {
        /// Every byte is held but the file fails its hash (pieces cut out, or a source suspected).
        case hashFailed
        /// Every connection retired with ranges left (they kept failing while others worked).
        case rangesLeft
        /// The representation changed (`reason`): the held bytes are discarded.
        case changed(String)
    }

    /// What the run does after a round ended without the file.
    enum NextRound: Equatable {
        /// A fresh round of connections takes the rest.
        case again
        /// Everything held is discarded first (`notice`: what to say).
        case startOver(notice: String)
        /// The run fails.
        case fail(PickupError)
    }

    /// A round ended without the file (`why`): another round, within `maxRestarts` in the run
    /// (the budget of attempts without progress); responses that keep disagreeing on the file's
    /// validators (several servers behind one name, each with its own) finish over one connection
    /// from the second restart on, so that one server's bytes make the file.
    mutating func roundEnded(_ why: RoundEnd, maxRestarts: Int, connections: Int) -> NextRound {
        restarts += 1
        let over = restarts > maxRestarts
        switch why {
        case .hashFailed:
            return over ? .fail(.verification("the file keeps failing its hash, whichever source its bytes come from")) : .again
        case .rangesLeft:
            return over ? .fail(.network("every connection failed with ranges left to fetch")) : .again
        case .changed(let reason):
            if over { return .fail(.server(status: nil, "\(reason), again after starting over")) }
            if restarts >= 2, connections > 1, fetchAlone(0, once: true) {
                return .startOver(notice: "\(reason) again; the responses disagree on the file's validators "
                    + "(a load balancer whose servers disagree?), so it starts over and finishes over one connection")
            }
            return .startOver(notice: "\(reason); starting over from zero")
        }
    }

    /// A response to a request with `If-Range` was taken: the bytes held at the start are confirmed.
    mutating func heldBytesConfirmed() { heldConfirmed = true }

    /// For the rest of the run only `connection` fetches (responses disagree on the file's
    /// validators). `once`: only when no connection fetches alone yet; returns whether it changed.
    @discardableResult
    mutating func fetchAlone(_ connection: Int, once: Bool = false) -> Bool {
        if once, alone != nil { return false }
        connections = .alone(connection)
        return true
    }

    /// The tuner brings the connections it shed back (``shedConnections(writers:)``).
    mutating func connectionsRestored() { if keeper != nil { connections = .all } }

    /// Range `segment`'s writer was seen at `position` at `now`: since when it has not moved.
    mutating func saw(_ segment: Int, at position: Int64, now: Double) {
        if lastSeen[segment]?.position != position { lastSeen[segment] = (position, now) }
    }

    /// A response head came `seconds` after its request was sent.
    mutating func answered(after seconds: Double) {
        latency = seconds
        quickestAnswer = min(quickestAnswer ?? seconds, seconds)
    }
    /// The most bytes held at once in this run: what the retry budget counts progress by (a
    /// restart does not lower it).
    private(set) var mostHeld: Int64 = 0
    /// The servers the file comes from and which connection asks which (``SourceSet``); their
    /// validators and rejections are the record's (``ControlRecord/mirrors``).
    private(set) var sources: SourceSet
    /// Which source wrote which bytes in this run (start, end, source), for blaming a bad piece.
    private(set) var provenance: [(start: Int64, end: Int64, source: Int)] = []
    /// Pieces checked against their hash in this run, as they completed (``PieceChecks``).
    private(set) var pieces = PieceChecks()

    /// What the piece hashes said of the bytes held now, by piece index. Forgotten (a new
    /// generation) whenever held bytes are discarded or cut out, so that a check that was
    /// running then records nothing about bytes that are not the ones it read.
    struct PieceChecks {
        var good: Set<Int> = []
        /// Failed, and already counted against the source that sent them.
        var bad: Set<Int> = []
        var generation = 0
        mutating func forget() {
            good = []
            bad = []
            generation &+= 1
        }
    }

    /// The round is over: what the pieces said so far stands, and a check still running records
    /// nothing more (the round's own check reads the rest). Returns what they said.
    mutating func sealPieces() -> PieceChecks {
        pieces.generation &+= 1
        return pieces
    }

    /// Piece `index`, read in `generation`, matched its hash (or not); false when the bytes changed since.
    mutating func checked(piece index: Int, good: Bool, generation: Int) -> Bool {
        guard generation == pieces.generation else { return false }
        if good { pieces.good.insert(index) } else { pieces.bad.insert(index) }
        return true
    }

    /// The pieces to check now: those wholly inside bytes the record holds durably and not found
    /// good or bad yet, with the length and the checks' generation (``checked(piece:good:generation:)``);
    /// nil once the run ended, while the length is unknown, or when `hashes` describe another length.
    func piecesToCheck(_ hashes: Metalink.Pieces) -> (todo: [Int], total: Int64, generation: Int)? {
        guard !ended, let total = record.totalLength, let count = hashes.count(total: total) else { return nil }
        var todo: [Int] = []
        for (a, b) in RunState.merged(record.segments.map { ($0.start, $0.start + $0.done) }) where b > a && b <= total {
            // The pieces wholly inside [a, b): from the first that starts there to the last that ends there.
            let first = Int(a / hashes.length + (a % hashes.length > 0 ? 1 : 0))
            let last = min(count - 1, b == total ? Int((b - 1) / hashes.length) : Int(b / hashes.length) - 1)
            if first <= last {
                for k in first...last where !pieces.good.contains(k) && !pieces.bad.contains(k) { todo.append(k) }
            }
        }
        return (todo, total, pieces.generation)
    }

    /// Piece `k`, bytes `start..<end`, read in `generation`, matched its hash or not. A bad piece
    /// is counted against its source once that is known: nil while a response still writing it
    /// has not said (the next check reads it again; one that several sources, or a run before a
    /// kill, wrote is bad with no one to blame). Else whether it was recorded (false: a new
    /// generation, or the round's end took over) and whether one source wrote all of it.
    mutating func pieceHashed(_ k: Int, good: Bool, start: Int64, end: Int64, generation: Int) -> (recorded: Bool, blame: Bool)? {
        let writing = writing()
        let sole = good ? nil : soleWriter(of: start, end, writing: writing)
        if !good, sole == nil, writing.contains(where: { $0.start < end && $0.end > start }) { return nil }
        return (checked(piece: k, good: good, generation: generation), sole != nil)
    }

    /// `bad` pieces are counted against the sources that wrote all of each (``soleWriter(of:_:writing:)``,
    /// ``badPiece(from:writers:)``): one that keeps sending bad pieces is rejected. Returns those
    /// sources' URLs (redacted), the notices to show, and whether it is old news (every source
    /// blamed was retired already, and nothing new is said).
    mutating func blame(_ bad: [(start: Int64, end: Int64)], now: Double) -> (blamed: [String], notices: [String], known: Bool) {
        var blamed = Set<Int>(), notices: [String] = []
        let writing = writing()
        for (a, b) in bad {
            guard let s = soleWriter(of: a, b, writing: writing) else { continue }
            blamed.insert(s)
            if let notice = badPiece(from: s, writers: writers(now: now)) { notices.append(notice) }
        }
        let known = !blamed.isEmpty && notices.isEmpty && blamed.allSatisfy { sources.isRetired($0) }
        return (blamed.sorted().map { DownloadURL.redacted(sources.sources[$0].url) }, notices, known)
    }

    /// What a length announced by a source means when a Metalink document gave the file's.
    enum LengthCheck: Equatable {
        /// It fits (the same length, or none from the only live source: the finished file must have it).
        case fits
        /// Not this file: the source is retired (`notice`: what to say; empty when another
        /// connection retired it already) and its range goes on from another.
        case rejected(why: String, notice: String)
        /// Not this file, and no other source is live: the download fails.
        case fails(why: String, url: String)
    }

    /// Source `source` announced `announced` bytes (nil: none) where the Metalink document says
    /// `expected`: never trusted over the length. One that announces none (an FTP server without
    /// SIZE, a gateway) is left for another source when there is one; alone, it is taken.
    mutating func lengthAnnounced(_ announced: Int64?, expected: Int64, source: Int) -> LengthCheck {
        guard announced != expected else { return .fits }
        if announced == nil, !sources.live.contains(where: { $0 != source }) { return .fits }
        let why = announced.map { "it announces \($0) bytes, the Metalink document \(expected)" }
            ?? "it announces no length, the Metalink document \(expected) bytes"
        guard let notice = retireOtherFile(source, why: why) else { return .fails(why: why, url: sources.url(source)) }
        return .rejected(why: why, notice: notice)
    }

    init(record: ControlRecord, minSplit: Int64, sources: SourceSet? = nil, cookies: [Cookie] = []) {
        checkpoints = Checkpoints(record: record)
        jar = cookies
        self.minSplit = minSplit
        self.sources = sources ?? SourceSet(urls: [record.url], connections: 1)
        alignMirrors()
    }

    /// The record's mirrors follow the sources (in order), keeping each one's validators and
    /// rejection by URL; a rejected mirror stays retired.
    private mutating func alignMirrors() {
        let oldURLs = [record.url] + (record.mirrors ?? []).map(\.url)
        let old = record.mirrors ?? []
        let aligned = sources.sources.dropFirst().map { s in old.first { $0.url == s.url } ?? SourceRecord(url: s.url) }
        if (record.mirrors ?? []) != aligned { checkpoints.update { $0.mirrors = aligned.isEmpty ? nil : aligned } }
        for (i, m) in aligned.enumerated() { if let why = m.rejected { _ = sources.retire(i + 1, why: why) } }
        // Who wrote what, by the sources' places now (a source no longer given is forgotten).
        let place = Dictionary(sources.sources.enumerated().map { ($1.url, $0) }, uniquingKeysWith: { a, _ in a })
        // A control file is input like any other: entries inside the length, not too many.
        let length = record.totalLength ?? 0
        provenance = (record.writers ?? []).prefix(2000).compactMap { w in
            guard w.count == 3, w[0] >= 0, w[0] < w[1], w[1] <= length, oldURLs.indices.contains(Int(clamping: w[2])),
                let s = place[oldURLs[Int(clamping: w[2])]] else { return nil }
            return (w[0], w[1], s)
        }
    }

    /// Before a checkpoint: the record's writers become this run's provenance and the attempts
    /// in flight (`inFlight`: start, current end, source), merged (several sources only).
    private mutating func recordWriters(inFlight: [(start: Int64, end: Int64, source: Int)]) {
        guard sources.several else { return }
        var merged: [[Int64]] = []
        for w in (provenance + inFlight).filter({ $0.end > $0.start }).sorted(by: { ($0.start, $0.source) < ($1.start, $1.source) }) {
            if let last = merged.last, last[2] == Int64(w.source), w.start <= last[1] {
                merged[merged.count - 1][1] = max(last[1], w.end)
            } else {
                merged.append([w.start, w.end, Int64(w.source)])
            }
        }
        if merged.count > 2000 { merged = Array(merged.suffix(2000)) }
        if merged != (record.writers ?? []) { checkpoints.update { $0.writers = merged.isEmpty ? nil : merged } }
    }

    /// Source `i` sent bytes that are not this file's (`why`): retired (and, for a mirror, remembered
    /// in the record) while another is live. Returns the notice, nil when it is the last live one.
    /// A mirror whose answer shows `otherFile` is said to be another file than the URL given first.
    mutating func reject(_ i: Int, why: String, otherFile: Bool = false) -> String? {
        guard sources.canReject(i), var notice = sources.retire(i, why: why) else { return nil }
        if i > 0 { checkpoints.update { r in if r.mirrors?.indices.contains(i - 1) == true { r.mirrors![i - 1].rejected = why } } }
        if otherFile, i > 0 {
            notice = "\(DownloadURL.redacted(sources.sources[i].url))\(DownloadEvent.notTheSameFile)\(DownloadURL.redacted(sources.sources[0].url)) "
                + "(\(why)): ignored as a mirror"
        }
        return notice
    }

    /// Source `i` is known not to be this file (another length than the request gives): retired
    /// while another source is live, whether or not one has answered yet. Nil when it is the last.
    mutating func retireOtherFile(_ i: Int, why: String) -> String? {
        guard let notice = sources.retireOtherFile(i, why: why) else { return nil }
        if i > 0 { checkpoints.update { r in if r.mirrors?.indices.contains(i - 1) == true { r.mirrors![i - 1].rejected = why } } }
        return notice
    }

    /// A mirror named along the way (`Link: rel=duplicate`) becomes a source.
    mutating func addMirror(_ url: String, connections: Int) {
        guard sources.add(url, connections: connections) != nil else { return }
        checkpoints.update { $0.mirrors = ($0.mirrors ?? []) + [SourceRecord(url: url)] }
    }

    /// Source `source` wrote `start..<end` (what any source wrote there before is overwritten).
    mutating func wrote(_ start: Int64, _ end: Int64, by source: Int) {
        guard end > start, provenance.count < 100_000 else { return }
        forget([(start, end)])
        provenance.append((start, end, source))
    }

    /// No source wrote `ranges` any more (their bytes are to be fetched again).
    private mutating func forget(_ ranges: [(start: Int64, end: Int64)]) {
        for (a, b) in ranges {
            provenance = provenance.flatMap { w -> [(start: Int64, end: Int64, source: Int)] in
                guard w.start < b, w.end > a else { return [w] }
                return [(w.start, a, w.source), (b, w.end, w.source)].filter { $0.end > $0.start }
            }
        }
    }

    /// The byte ranges `source` wrote (this run, and earlier ones the control file remembers), merged.
    func written(by source: Int) -> [(start: Int64, end: Int64)] {
        Self.merged(provenance.filter { $0.source == source }.map { ($0.start, $0.end) })
    }

    /// `ranges` sorted, overlapping and touching ones joined.
    static func merged(_ ranges: [(start: Int64, end: Int64)]) -> [(start: Int64, end: Int64)] {
        var merged: [(start: Int64, end: Int64)] = []
        for r in ranges.sorted(by: { $0.start < $1.start }) where r.end > r.start {
            if let last = merged.last, r.start <= last.end {
                merged[merged.count - 1].end = max(last.end, r.end)
            } else {
                merged.append(r)
            }
        }
        return merged
    }

    /// The bytes of `0..<total` no source is known to have written (held from before a kill,
    /// written after its last checkpoint: the cursor file keeps no source).
    func unattributed(total: Int64) -> [(start: Int64, end: Int64)] {
        var gaps: [(start: Int64, end: Int64)] = []
        var next: Int64 = 0
        for w in provenance.sorted(by: { $0.start < $1.start }) {
            if w.start > next { gaps.append((next, min(w.start, total))) }
            next = max(next, w.end)
        }
        if next < total { gaps.append((next, total)) }
        return gaps.filter { $0.end > $0.start }
    }

    /// The sources that wrote bytes in this run, the largest share first.
    var writersByShare: [Int] {
        var share: [Int: Int64] = [:]
        for w in provenance {
            let (sum, overflow) = share[w.source, default: 0].addingReportingOverflow(w.end - w.start)
            share[w.source] = overflow ? .max : sum
        }
        return share.keys.sorted { (share[$0]!, -$0) > (share[$1]!, -$1) }
    }

    /// The source that wrote all of `start..<end` in this run, when one did alone (a piece written
    /// partly by several sources, or before a kill, blames none of them).
    func soleWriter(of start: Int64, _ end: Int64, writing: [(start: Int64, end: Int64, source: Int)] = []) -> Int? {
        let writers = (provenance + writing).filter { $0.start < end && $0.end > start }
        guard let s = writers.first?.source, writers.allSatisfy({ $0.source == s }) else { return nil }
        // Covered without a gap (bytes from before this run have no writer).
        var next = start
        for w in writers.sorted(by: { $0.start < $1.start }) where w.start <= next { next = max(next, w.end) }
        return next >= end ? s : nil
    }

    /// Bytes `bad` (pieces that failed their hash) are no longer held: the ranges covering them
    /// are cut around them and the ranges rebuilt, unowned; the store returned must be carried out
    /// before a byte is written. Every range must be complete (the round is over and its checkpoint stored).
    mutating func reopen(_ bad: [(start: Int64, end: Int64)]) -> Checkpoints.Action {
        cursors = [:]
        guard let total = record.totalLength else { return .none }
        // Every byte is held: the ranges are the held stretches between the bad pieces, and the
        // bad pieces, empty.
        let merged = Self.merged(bad.map { (max(0, $0.start), min(total, $0.end)) })
        var segments: [SegmentRecord] = []
        var next: Int64 = 0
        for (a, b) in merged {
            if a > next { segments.append(SegmentRecord(start: next, end: a, done: a - next)) }
            segments.append(SegmentRecord(start: a, end: b, done: 0))
            next = b
        }
        if next < total { segments.append(SegmentRecord(start: next, end: total, done: total - next)) }
        forget(merged)
        pieces.forget()
        let action = checkpoints.reshaped(segments)
        rebuildRanges(claiming: nil)
        return action
    }

    /// The control record: the download's description and each range's durable bytes.
    var record: ControlRecord { checkpoints.record }
    var onDisk: Checkpoints.OnDisk { checkpoints.onDisk }
    var ended: Bool { checkpoints.ended }
    var isComplete: Bool { scheduler?.isComplete == true }
    var activeConnections: Int { scheduler?.activeConnections ?? 0 }

    // MARK: - Events

    /// `held` bytes are held now: returns the most ever held, this included.
    mutating func heldAtMost(_ held: Int64) -> Int64 {
        mostHeld = max(mostHeld, held)
        return mostHeld
    }

    /// A control file was read (and ``Recovery`` kept it): the record, and ranges over it when
    /// the length is known.
    mutating func loaded(_ record: ControlRecord) {
        checkpoints.loaded(record)
        alignMirrors()
        rebuildRanges(claiming: nil)
    }

    /// The control file was removed.
    mutating func removed() { checkpoints.removed() }

    /// The download's description changed (validators, length, target); ranges change through
    /// ``ranges(_:)`` only.
    mutating func describe(_ change: (inout ControlRecord) -> Void) { checkpoints.update(change) }

    /// The target's path, chosen outside the lock for an answer that named it: recorded unless
    /// another answer named it meanwhile (the first name stays), or `replacing` (a finished file's
    /// check, answered with another version, names it anew).
    mutating func named(_ target: String, replacing: Bool) {
        guard record.target == nil || replacing else { return }
        describe { $0.target = target }
    }

    /// Where the writer of range `segment`, which starts at `start`, stops now: the scheduler's
    /// end of that range, the one owner of a range's end (``lowerEnd(of:)``
    /// copies it to the writers). Nil without ranges, or when that range is not this one now.
    func end(ofRange segment: Int, startingAt start: Int64) -> Int64? {
        guard let s = scheduler, s.segments.indices.contains(segment), s.segments[segment].start == start else { return nil }
        return s.segments[segment].end
    }

    /// A body of unknown length ended (or a 416 confirmed it): the file is what `cursor`'s range
    /// holds, its length where the writer is. (No ranges are built: the run is at its end.)
    mutating func unknownLengthEnded(writtenBy cursor: SegmentCursor) {
        guard record.totalLength == nil else { return }
        let length = cursor.position.load(ordering: .relaxed)
        // (No ranges are built for such a body: its writer's end is set here, with the record's.)
        cursor.end.store(length, ordering: .relaxed)
        checkpoints.update { r in
            r.totalLength = length
            if r.segments.indices.contains(cursor.segment) { r.segments[cursor.segment].end = length }
        }
    }

    /// The complete length became known from a response to range `segment`: ranges are built
    /// over the record, `segment` ending at `total` and owned by connection `owner`.
    mutating func lengthKnown(_ total: Int64, claiming segment: Int, by owner: Int = 0) {
        guard scheduler == nil else { return }
        checkpoints.update { r in
            if r.segments.indices.contains(segment) { r.segments[segment].end = total }
        }
        rebuildRanges(claiming: segment, by: owner)
    }

    /// Connection `id` stalled (no byte within its stall timeout). It is more patient next time
    /// when the stall came before any body byte or when it has stalled before; returns its patience.
    @discardableResult
    mutating func stalled(_ id: Int, beforeBody: Bool) -> Int {
        if beforeBody || stalledBefore.contains(id) { patience[id] = min(16, (patience[id] ?? 0) + 1) }
        stalledBefore.insert(id)
        return patience[id] ?? 0
    }

    /// Whether connection `id` must stop because another goes on alone.
    func isStopped(_ id: Int) -> Bool { alone.map { $0 != id } ?? false }

    /// The connections a round may run: one once they must go on alone.
    func connectionsAllowed(_ wanted: Int) -> Int { alone == nil ? wanted : 1 }

    /// Changes the ranges (plan, split, shed, claim, release, progress reports), then projects
    /// their shape into the record. Returns what `change` returns; nil without ranges. (Private:
    /// the ranges change only through the named events.)
    @discardableResult
    private mutating func ranges<T>(_ change: (inout SegmentScheduler) -> T) -> T? {
        guard var s = scheduler else { return nil }
        let result = change(&s)
        let shapeChanged = s.segments.count != scheduler!.segments.count
            || zip(s.segments, scheduler!.segments).contains { $0.start != $1.start || $0.end != $1.end }
        scheduler = s
        if shapeChanged { project() }
        return result
    }

    /// What a valid 206 (``ResponseDecision/append(at:end:total:validators:)``) to range
    /// `segment` means: the record learns the validators, length and digest the first time; the
    /// ranges are built once the length is known; the first 206 of a round decides on more
    /// connections (only with a strong validator) and plans their ranges.
    struct Partial: Equatable {
        /// The record's description changed: written before the body when no control file exists.
        var described = false
        /// Ranges with bytes left, when this response decided on more connections (then more
        /// than one means: open them).
        var running: Int?
        /// The complete length, to preallocate, when this response decided.
        var decidedTotal: Int64?
    }

    mutating func partialResponse(segment: Int, at: Int64, end: Int64? = nil, total: Int64?, validators: Validators, source: Int = 0,
                                  connection: Int? = nil, digest: ExpectedDigest?, connections: Int) -> Partial {
        var result = Partial()
        if record.validators(of: source) == nil || record.totalLength == nil && total != nil {
            result.described = true
            checkpoints.update { r in
                r.setValidators(validators, of: source)
                r.totalLength = total
                if at == 0 || r.serverDigest == nil { r.serverDigest = digest }
            }
        }
        if source == 0 {
            // Served by the URL given itself: a redirect's target is not what a background
            // transfer asks (the system would follow the redirect, and the answer be refused).
            let served: Bool? = sources.url(0) == record.url ? true : nil
            if record.rangesServed != served { checkpoints.update { $0.rangesServed = served } }
        }
        sources.accepted(source, connection: connection)
        if scheduler == nil, let total { lengthKnown(total, claiming: segment) }
        // Where this response ends: the plan and later splits land there when they can.
        ranges { $0.requesting(segment, upTo: end) }
        if !connectionsDecided, let total = scheduler?.total {
            connectionsDecided = true
            result.decidedTotal = total
            // Several sources split the file by length alone (each with its own validators).
            let parallel = connections > 1 && (validators.ifRange != nil || sources.several)
            result.running = ranges { s -> Int in
                if parallel { s.plan(connections: connections) }
                return s.segments.filter({ $0.remaining > 0 }).count
            }
            if !parallel { result.running = min(result.running ?? 1, 1) }
        }
        return result
    }

    /// The first unfinished range (the first connection's), claimed by connection 0.
    mutating func firstRange() -> (index: Int, start: Int64, done: Int64, end: Int64?) {
        let segments = record.segments
        let i = segments.indices.first { segments[$0].done < (segments[$0].end ?? .max) - segments[$0].start } ?? 0
        ranges { $0.claim(i, by: 0) }
        return (i, segments[i].start, segments[i].done, segments[i].end)
    }

    /// A periodic checkpoint: the record's writers become this run's provenance and the responses
    /// in flight (``recordWriters(inFlight:)``); the record claiming what each range's writer has
    /// written, for the caller to fsync the data and store.
    mutating func checkpoint() -> Checkpoints.Action {
        recordWriters(inFlight: writing())
        return checkpoints.checkpoint(written: writtenByRange())
    }

    /// Takes back ranges found written after a kill (``Recovery``): the record claiming them,
    /// for the caller to fsync the data and store before anything else.
    func recovered(_ merged: [SegmentRecord]) -> Checkpoints.Action { checkpoints.recovered(merged) }

    /// The record as it is now, to be written without fsync (it claims nothing new).
    func storeNow() -> Checkpoints.Action { checkpoints.storeNow() }
    var wantsStoreSoon: Bool { checkpoints.wantsStoreSoon }

    /// `stored` (of `version`) is on disk: its claims are durable, in the record and in the ranges.
    mutating func stored(_ stored: ControlRecord, version: Int) {
        checkpoints.stored(stored, version: version)
        guard let s = scheduler else { return }
        let sameShape = s.segments.count == record.segments.count
            && zip(s.segments, record.segments).allSatisfy { $0.start == $1.start && $0.end == ($1.end ?? s.total) }
        if !sameShape {
            // A recovery stored other ranges: they are the ranges from now on (no owner yet).
            rebuildRanges(claiming: nil)
            return
        }
        // (On a copy, assigned once: the scheduler's observer lowers the writers' ends once, not per range.)
        var reported = s
        for (i, r) in record.segments.enumerated() { reported.report(i, done: r.done) }
        scheduler = reported
    }

    /// Every held byte is being discarded (`reset` describes the new representation): the
    /// ranges and observations go, and the store to carry out before a new byte is written.
    mutating func restarted(_ reset: (inout ControlRecord) -> Void) -> Checkpoints.Action {
        keptFromStart = 0
        provenance = []
        pieces.forget()
        lastSeen = [:]
        connectionsRestored()
        cursors = [:]
        scheduler = nil
        // Every source's validators, rejections and writes were about the bytes discarded now.
        return checkpoints.restarted { r in
            r = r.holdingNothing(rejections: false)
            reset(&r)
        }
    }

    /// Every byte is written and fsynced: the ranges go; the store to carry out, if any.
    mutating func finishing(size: Int64, verifying: Bool) -> Checkpoints.Action {
        lastSeen = [:]
        cursors = [:]
        scheduler = nil
        return checkpoints.finishing(size: size, verifying: verifying)
    }

    /// The run is over: nothing is written from now on.
    mutating func end() { checkpoints.end() }

    // MARK: - Connections, as events

    /// What the engine sees of one range's writer when an event needs it (read from the writer's
    /// cursor, the atomics that are the I/O edge): how far it has written and how fast it goes.
    struct Writer: Equatable {
        /// Bytes written in the range, from its start.
        var written: Int64
        /// The next byte the writer writes.
        var position: Int64
        /// Where and when the writer's connection started on this range.
        var beganAt: Int64
        var began: Double
        /// Bytes per second since it started (nil before there is anything to measure).
        var rate: Double?
    }

    /// A range given to a connection: its index, its first byte, where its writer goes on and
    /// where it ends.
    struct Assignment: Equatable {
        var segment: Int
        var start: Int64
        var next: Int64
        var end: Int64
    }

    /// Connection `id` starts: it asks source `asked` (the URL given first, or the source a
    /// finished file's validators are from) unless that one is retired or sent a bad piece while
    /// another can be asked, else the best source with room. False when no source has room.
    mutating func connectionStarted(_ id: Int, asking asked: Int) -> Bool {
        if id == 0, sources.sources.indices.contains(asked), !sources.isRetired(asked),
            sources.sources[asked].badPieces == 0 || sources.pick(avoiding: asked) == nil
        {
            sources.bind(0, to: asked)
            return true
        }
        return sources.bind(id) != nil
    }

    /// Connection `id` starts a run's work: it asks the source whose URL `finishedAt` is (the
    /// source a finished file's validators are from, when the run checks one), else the URL given
    /// first, as ``connectionStarted(_:asking:)`` allows. Returns the source it asks and whether
    /// that is the one asked (else the finished file's check is not made on this connection); nil
    /// when no source has room.
    mutating func connectionStarts(_ id: Int, finishedAt: String?) -> (source: Int, asked: Bool)? {
        let asked = finishedAt.flatMap { u in sources.sources.firstIndex { $0.url == u } } ?? 0
        guard connectionStarted(id, asking: asked), let source = sources.source(of: id) else { return nil }
        return (source, source == asked)
    }

    /// The first unfinished range's writer, claimed by connection 0 (``firstRange()``).
    mutating func firstWriter() -> SegmentCursor {
        let first = firstRange()
        let c = cursor(first.index, start: first.start, position: first.start + first.done, end: first.end)
        writes(c)
        return c
    }

    /// What a connection out of work does next.
    enum Work {
        /// Writes this range (its writer registered).
        case range(SegmentCursor)
        /// Asks again after these seconds: the endgame, where a range still running could count
        /// as stalled by then (``endgameWait(_:writers:now:)``).
        case wait(Double)
        /// Nothing is left for it.
        case none

        var cursor: SegmentCursor? { if case .range(let c) = self { c } else { nil } }
    }

    /// The next work of connection `id`: a range (``assign(_:unownedOnly:writers:now:connections:)``,
    /// with the writers sampled now), else, in the `endgame`, a wait before asking again.
    mutating func work(for id: Int, unownedOnly: Bool = false, endgame: Bool = false, now: Double, connections: Int) -> Work {
        let writers = writers(now: now)
        if let a = assign(id, unownedOnly: unownedOnly, writers: writers, now: now, connections: connections) {
            let c = cursor(a.segment, start: a.start, position: a.next, end: a.end)
            writes(c)
            return .range(c)
        }
        guard endgame, let wait = endgameWait(id, writers: writers, now: now) else { return .none }
        return .wait(wait)
    }

    /// Whether connection `id`, out of work, waits for the shed connections to be brought back
    /// (``ConnectionTuner``): it is not the one kept and bytes are left.
    func waitsForRestore(_ id: Int) -> Bool { keeper != nil && keeper != id && scheduler?.isComplete == false }

    /// Connection `id` ended: its source has room again and its range no owner. Returns true when
    /// it was the one connection the tuner kept for good (its decision made) and bytes are left:
    /// the held connections are brought back (else they would wait for a restore that never
    /// comes), for the caller to open their gate. (During a trial the tuner's next sample
    /// decides: the one connection gone, it is clearly slower, and restores.)
    @discardableResult
    mutating func connectionLeft(_ id: Int) -> Bool {
        sources.unbind(id)
        ranges { $0.release(id) }
        guard keeper == id, !tuning, scheduler?.isComplete == false else { return false }
        connectionsRestored()
        return true
    }

    /// What connection `id` does before an attempt at source `source`.
    enum BeforeAttempt: Equatable {
        /// It stops: another connection goes on alone (a response replaced every held byte, so
        /// this one's range is gone), or its source was retired and no other has room.
        case stop
        /// Bytes held from an earlier run must be confirmed first, and no source that can (one
        /// with a strong validator for `If-Range`) is left.
        case noConfirmer
        /// It asks `source` (the one it had, or another), with that source's validators and the
        /// length; `several`: the file has several sources (mirrors named by a first answer make
        /// several of one); `patience`: how long its transport waits for a slow answer (``stalled(_:beforeBody:)``).
        case go(source: Int, several: Bool, validators: Validators?, total: Int64?, patience: Int)
    }

    /// Before each attempt of connection `id` at `source` (`holding`: its range has bytes written):
    /// a retired source is left for another with room; bytes held from an earlier run are
    /// confirmed first by a source that can (one that never answered could send another
    /// version's bytes).
    mutating func beforeAttempt(_ id: Int, at source: Int, holding: Bool) -> BeforeAttempt {
        if isStopped(id) { return .stop }
        let several = sources.several
        var source = source
        if several, sources.isRetired(source) {
            guard let to = moveOn(id) else { return .stop }
            source = to
        }
        if several, holding, record.validators(of: source)?.ifRange == nil, !heldConfirmed {
            guard let to = confirmingSource(for: id) else { return .noConfirmer }
            source = to
        }
        return .go(source: source, several: several, validators: record.validators(of: source), total: record.totalLength,
                   patience: patience[id] ?? 0)
    }

    /// Connection `id` leaves its source for the best other one with room; nil when none has room.
    private mutating func moveOn(_ id: Int) -> Int? { sources.bind(id) }

    /// Connection `id` moves to a source that can confirm the bytes held from an earlier run (one
    /// with a strong validator for `If-Range`); nil when none is live.
    private mutating func confirmingSource(for id: Int) -> Int? {
        guard let c = sources.live.first(where: { record.validators(of: $0)?.ifRange != nil }) else { return nil }
        sources.bind(id, to: c)
        return c
    }

    /// An attempt of connection `id` at source `source` wrote `from..<to` in `seconds`, however it
    /// ended: its source is measured, and the bytes are the source's if they are of the
    /// representation held now (its response's epoch, ``responseBegan(_:from:source:cursor:)``).
    mutating func attemptEnded(_ id: Int, source: Int, wrote from: Int64, to: Int64, seconds: Double) {
        sources.measured(source, bytes: to - from, seconds: seconds)
        // (Bytes of a representation discarded since are nobody's.)
        if let response = responses.removeValue(forKey: id), response.epoch == record.epoch { wrote(from, to, by: source) }
    }

    /// Requests to source `source` go to `url` from now on (it redirected).
    mutating func redirected(_ source: Int, to url: String) { sources.redirected(source, to: url) }

    /// Why a source's answer makes connection leave it (``sourceFault(_:at:_:why:)``).
    enum SourceFault: Equatable {
        /// Not this file: another length, no ranges, other validators (`otherFile`: said to be
        /// another file than the URL given first).
        case notThisFile(otherFile: Bool)
        /// Its file changed (another length or validators than the bytes held).
        case changed
        /// It refused the file (a final 4xx or 5xx).
        case refused
    }

    /// What a connection does after a source's fault.
    enum AfterFault: Equatable {
        /// Goes on at that source.
        case moveTo(Int)
        /// Leaves: no source has room for it, or others fetch and take its range.
        case leave
        /// The only source's file changed: the run starts over from zero.
        case startOver
        /// The only source refused the file and no other connection fetches: the download fails.
        case fail
    }

    /// Source `source` answered connection `id` with `fault` (`why`). With several sources the
    /// source is retired while another is live (a mirror's rejection remembered in the record),
    /// and the connection moves to the best one with room; a changed file at a source another
    /// connection retired a moment ago moves it on too (the held bytes stay). With one source a
    /// changed file starts over, and a refusal retires the connection while others fetch, else
    /// fails the download. Returns what it does, and the notice to show, if any.
    mutating func sourceFault(_ id: Int, at source: Int, _ fault: SourceFault, why: String) -> (AfterFault, notice: String?) {
        let several = sources.several
        var notice: String?
        switch fault {
        case .notThisFile(let otherFile):
            notice = reject(source, why: why, otherFile: otherFile)
        case .changed:
            notice = several ? reject(source, why: why, otherFile: true) : nil
            guard notice != nil || (several && sources.isRetired(source)) else { return (.startOver, nil) }
        case .refused:
            notice = several ? sources.retire(source, why: why) : nil
            guard notice != nil else {
                return activeConnections > 1 ? (.leave, Attempt.retired(id, why)) : (.fail, nil)
            }
        }
        return (moveOn(id).map { .moveTo($0) } ?? .leave, notice)
    }

    /// What an attempt's outcome is decided with (``Attempt/Facts``), `held` bytes being held
    /// now; nil when connection `id` is to stop (another goes on alone). The held bytes wait for
    /// confirmation only at a source that can confirm them: one without a strong validator (a
    /// dead first URL that never answered) is left like any failing source.
    mutating func facts(for id: Int, holding held: Int64) -> Attempt.Facts? {
        guard !isStopped(id) else { return nil }
        let confirmer = sources.source(of: id).map { record.validators(of: $0)?.ifRange != nil } ?? false
        return Attempt.Facts(held: heldAtMost(held), othersFetching: activeConnections > 1, several: sources.several,
                             confirmsHeld: !heldConfirmed && confirmer, total: record.totalLength)
    }

    /// An attempt of connection `id` at source `source` failed with `failure` (several sources):
    /// a busy source takes no more (said once per change of its cap), a failing one is left for
    /// another with room, one that asks to wait too long (`tooLong`) or keeps failing is retired.
    mutating func attemptFailed(source: Int, connection id: Int, _ failure: Attempt.Failure, tooLong: Bool) -> (SourceSet.Next, String?) {
        let others = activeConnections > 1
        if tooLong, let retired = sources.retire(source, moving: id, why: "\(failure.message); it asks to retry after \(failure.retryAfter ?? 0) s") {
            return retired
        }
        guard failure.busy else { return sources.failed(source, connection: id, why: failure.message) }
        let cap = sources.sources[source].cap
        let (next, retired) = sources.busy(source, connection: id, othersFetching: others, why: failure.message)
        return (next, retired ?? (sources.sources[source].cap < cap ? sources.capNotice(source) : nil))
    }

    /// Source `source` wrote a piece that failed its hash: counted; one that keeps sending bad
    /// pieces is rejected (the notice), and the ranges its connections write end where they are
    /// (`writers`), the rest going back to the others.
    mutating func badPiece(from source: Int, writers: [Int: Writer]) -> String? {
        guard sources.badPiece(source),
            let notice = reject(source, why: "\(sources.sources[source].badPieces) pieces it sent failed their hash")
        else { return nil }
        stopWriting(from: source, writers: writers)
        return notice
    }

    /// The ranges `source`'s connections are writing end where they are (`writers`), and the rest
    /// goes back to the scheduler for the other sources.
    mutating func stopWriting(from source: Int, writers: [Int: Writer]) {
        let connections = sources.sources[source].connections
        guard !connections.isEmpty else { return }
        ranges { s in
            for (i, w) in writers { s.report(i, done: w.written) }
            s.cut(owners: connections)
        }
    }

    /// While the bad source is searched for, `source` (nil: none) takes no connection.
    mutating func suspend(_ source: Int?) { sources.suspend(source) }

    /// The tuner tries one connection (``ConnectionTuner/Action/shed``): the fastest writer's
    /// (`writers`) goes on, the others are held with their ranges. Returns the connection that
    /// goes on, nil when none writes.
    mutating func holdConnections(writers: [Int: Writer]) -> Int? {
        guard alone == nil else { return nil }
        let kept = ranges { s -> Int? in
            for (i, w) in writers { s.report(i, done: w.written) }
            return s.fastest(rates: writers.compactMapValues(\.rate)).flatMap { s.segments[$0].owner }
        }
        guard let keep = kept ?? nil else { return nil }
        connections = .shed(keeper: keep)
        return keep
    }

    /// The tuner shed the connections: every range but the fastest writer's (`writers`) ends
    /// where it is; that writer's connection goes on alone. Returns whether it did.
    @discardableResult
    mutating func shedConnections(writers: [Int: Writer]) -> Bool {
        guard alone == nil else { return false }
        let kept = ranges { s -> Int? in
            for (i, w) in writers { s.report(i, done: w.written) }
            return s.shed(rates: writers.compactMapValues(\.rate))
        }
        guard let keep = kept ?? nil else { return false }
        connections = .shed(keeper: keep)
        return true
    }

    /// The next range for connection `id` (`unownedOnly`: only a range no connection has),
    /// splitting another connection's when worth it (``SegmentScheduler/next(for:rates:thiefRate:connections:quiet:)``):
    /// a stalled range taken over whole is asked of another source if one has room. Nil when
    /// there is none, or another connection goes on alone.
    mutating func assign(_ id: Int, unownedOnly: Bool, writers: [Int: Writer], now: Double, connections: Int) -> Assignment? {
        guard scheduler != nil else { return nil }
        if let only = self.connections.only, only != id {
            ranges { $0.release(id) }
            return nil
        }
        let (rates, ownRate, quiet) = observe(for: id, writers: writers, now: now)
        // (After `observe`, which reports every range's progress: a finished range whose last
        // bytes were not reported yet is not work.)
        if unownedOnly, scheduler?.hasUnowned != true {
            ranges { $0.release(id) }
            return nil
        }
        // The thief is expected to go as fast as it did on the range it just finished; a
        // connection with no history yet, as fast as the fastest live one.
        guard let a = ranges({ s in
            s.next(for: id, rates: rates, thiefRate: ownRate ?? rates.values.max(), connections: connections, quiet: quiet)
        }) ?? nil, let s = scheduler else { return nil }
        if let (victim, _) = a.shrunk, s.segments[victim].remaining == 0, let owner = s.segments[victim].owner,
            let slow = sources.source(of: owner)
        {
            sources.takeOver(id, from: slow)
        }
        let seg = s.segments[a.segment]
        return Assignment(segment: a.segment, start: seg.start, next: seg.next, end: seg.end)
    }

    /// Seconds until a range could count as stalled for the scheduler's endgame, if it does not
    /// move by then; nil when there is no range to wait on (none left, or shed to another connection).
    mutating func endgameWait(_ id: Int, writers: [Int: Writer], now: Double) -> Double? {
        guard let before = scheduler, !before.isComplete, connections.only == nil || connections.only == id else { return nil }
        let quiet = observe(for: id, writers: writers, now: now).quiet
        guard let s = scheduler else { return nil }
        let waits = quiet.compactMap { i, q -> Double? in
            let seg = s.segments[i]
            return seg.owner != nil && seg.remaining > 0 ? q.stallTime(remaining: seg.remaining) - q.seconds : nil
        }
        return waits.min().map { max(0.001, $0) }
    }

    /// Reports every range's progress (`writers`) and measures, by range, the speed of the other
    /// connections, the speed of `id`'s own range, and, once a request's latency is known, how
    /// long each other range that has received bytes in this run has not moved (zero if it just did).
    private mutating func observe(for id: Int, writers: [Int: Writer], now: Double)
        -> (rates: [Int: Double], own: Double?, quiet: [Int: SegmentScheduler.Quiet])
    {
        var rates: [Int: Double] = [:]
        var own: Double? = nil
        var quiet: [Int: SegmentScheduler.Quiet] = [:]
        ranges { s in for (i, w) in writers { s.report(i, done: w.written) } }
        guard let s = scheduler else { return (rates, own, quiet) }
        for (i, w) in writers where s.segments.indices.contains(i) {
            saw(i, at: w.position, now: now)
            if let since = lastSeen[i]?.since, w.position > w.beganAt, s.segments[i].owner != id, let latency {
                let rate = Double(w.position - w.beganAt) / max(since - w.began, 0.001)
                quiet[i] = .init(seconds: now - since, rate: rate, latency: latency)
            }
            guard let owner = s.segments[i].owner, let r = w.rate else { continue }
            if owner == id { own = r } else { rates[i] = r }
        }
        return (rates, own, quiet)
    }

    // MARK: - The writers

    /// A response writing now: where its bytes began, its source, its writer's cursor, and the
    /// epoch of the bytes it writes.
    struct Response {
        var from: Int64
        var source: Int
        var cursor: SegmentCursor
        var epoch: UInt64?
    }

    /// The writer of each range being (or last) written, by range index: its cursor, whose
    /// atomics the data path moves. A cursor's `end` is the data path's copy of its range's end,
    /// lowered here and nowhere else: to its range's end (``lowerEnds()``), or to where its writer
    /// is when a whole response replaces every held byte (``writeAlone(keeping:connection:)``) or
    /// a body of unknown length ends (``unknownLengthEnded(writtenBy:)``). Emptied when the ranges go (a restart, the
    /// finish, bad pieces reopened).
    private(set) var cursors: [Int: SegmentCursor] = [:]
    /// Responses writing now, by connection: the record's writers at a checkpoint, and whose
    /// bytes an attempt's end attributes (``attemptEnded(_:source:wrote:to:seconds:)``).
    private(set) var responses: [Int: Response] = [:]
    /// How the run ended without every byte fetched, once a connection learnt it (a finished
    /// file's check, a Metalink answer).
    private(set) var endedEarly: Transferred?

    /// The mapped cursor file of this run, once the download is large enough to keep one: where
    /// new cursors keep their positions (``cursor(_:start:position:end:)``).
    private(set) var cursorFile: CursorFile?

    /// The cursor file is mapped (once a run; a later mapping is not used).
    mutating func mapped(_ file: CursorFile) { if cursorFile == nil { cursorFile = file } }

    /// A cursor for range `segment`, its position kept in the cursor file when there is one.
    func cursor(_ segment: Int, start: Int64, position: Int64, end: Int64?) -> SegmentCursor {
        SegmentCursor(segment: segment, start: start, position: position, end: end, in: cursorFile)
    }

    /// `cursor` writes its range from now on (a range given, the first range, a cursor moved
    /// into the cursor file): its end follows the range's.
    mutating func writes(_ cursor: SegmentCursor) {
        cursors[cursor.segment] = cursor
        lowerEnd(of: cursor)
    }

    /// Lowers `cursor`'s end to its range's end, if the ranges say less (a writer not registered
    /// in ``cursors``, whose response is deciding, included).
    func lowerEnd(of cursor: SegmentCursor) {
        guard let end = end(ofRange: cursor.segment, startingAt: cursor.start), end < cursor.end.load(ordering: .relaxed) else { return }
        cursor.end.store(end, ordering: .relaxed)
    }

    /// Every writer's end follows its range's (a cut, a split, a shed, the plan, a response's end).
    private func lowerEnds() {
        guard scheduler != nil else { return }
        for c in cursors.values { lowerEnd(of: c) }
    }

    /// Whether `cursor`'s range was dropped when another response replaced every held byte (its
    /// response writes nothing).
    func isDropped(_ cursor: SegmentCursor) -> Bool { alone != nil && cursors[cursor.segment] !== cursor }

    /// A whole response to connection `connection`, written by `keep`, replaces every held byte:
    /// only it fetches from now on, every other range ends where its writer is (and leaves
    /// ``cursors``). Returns those writers, for the caller to wait until none is inside a chunk;
    /// nil when another response got there first (`keep` was dropped).
    mutating func writeAlone(keeping keep: SegmentCursor, connection: Int) -> [SegmentCursor]? {
        if isDropped(keep) { return nil }
        fetchAlone(connection)
        let others = cursors.values.filter { $0 !== keep }
        cursors = cursors.filter { $0.value === keep }
        for c in others { c.end.store(c.position.load(ordering: .relaxed), ordering: .sequentiallyConsistent) }
        return others
    }

    /// Connection `id`'s response writes from `from` on, from source `source`, through `cursor`.
    private mutating func responseBegan(_ id: Int, from: Int64, source: Int, cursor: SegmentCursor) {
        responses[id] = Response(from: from, source: source, cursor: cursor, epoch: record.epoch)
    }

    /// A connection learnt that the run ends without fetching every byte.
    mutating func ended(early: Transferred) { endedEarly = early }

    /// The writers as the decisions read them, sampled from their cursors now.
    func writers(now: Double) -> [Int: Writer] {
        cursors.mapValues { c in
            Writer(written: c.written, position: c.position.load(ordering: .relaxed), beganAt: c.beganAt, began: c.began,
                   rate: c.rate(now: now))
        }
    }

    /// Bytes written in each live range, by range index.
    func writtenByRange() -> [Int: Int64] {
        cursors.filter { record.segments.indices.contains($0.key) }.mapValues { $0.written }
    }

    /// What the responses in flight have written so far (start, end, source), of the bytes held now only.
    func writing() -> [(start: Int64, end: Int64, source: Int)] {
        let epoch = record.epoch
        return responses.values.filter { $0.epoch == epoch }.map { ($0.from, $0.cursor.position.load(ordering: .relaxed), $0.source) }
    }

    /// Bytes held: written in live ranges, durable in the others.
    var heldBytes: Int64 {
        record.segments.indices.reduce(0) { sum, i in
            sum + max(record.segments[i].done, cursors[i]?.written ?? 0)
        }
    }

    // MARK: - Cookies

    /// Cookies: the user's, and those servers set along the way (this run only).
    private(set) var jar: [Cookie]

    /// A response to `url` set cookies (`values`, its `Set-Cookie` fields): kept for the rest of the run.
    mutating func keepCookies(_ values: [String], from url: String, now: Int64) { Cookie.keep(values, from: url, in: &jar, now: now) }

    // MARK: - The path

    /// Why the partial download at this path, another URL's, is to be discarded once this URL
    /// answers with a file (nil: the path is this download's). Until then nothing here writes,
    /// stores or removes a thing at the path (``Recovery/Decision/anotherURL(_:)``).
    private(set) var foreign: String?
    /// The file already at a fixed name (`-o NAME`) when the run started is this URL's finished
    /// download (its completion record says so): a new version may go beside it. Any other file
    /// there is never replaced nor renamed around.
    private(set) var targetIsOurs = false

    /// The partial download at the path is another URL's (`why`), left as it is until this URL answers.
    mutating func foundForeign(_ why: String) { foreign = why }
    /// It was discarded: the path is this download's.
    mutating func foreignDiscarded() { foreign = nil }
    /// The file at the fixed name is this URL's finished download.
    mutating func fixedTargetIsOurs() { targetIsOurs = true }

    // MARK: - A range's answer

    /// A valid 206 to a range (``ResponseDecision/append(at:end:total:validators:)``), as the
    /// response head's thread hands it in, before a byte of its body is written.
    struct RangeAnswer {
        /// The writer that asked.
        var cursor: SegmentCursor
        var at: Int64
        var end: Int64?
        var total: Int64?
        var validators: Validators
        var source: Int
        var connection: Int
        var digest: ExpectedDigest?
        /// Seconds from the request to this head.
        var latency: Double
        /// The request carried `If-Range`: this answer confirms the bytes held.
        var confirming = false
        /// The request asked about a finished file: the target is chosen again.
        var conditional = false
        /// The mirrors the head names (`Link: rel=duplicate`), taken from the first answer of the URL given.
        var mirrors: [String] = []
        /// The connections the options want.
        var connections: Int
        /// A tuner to start if this answer opens more connections (adaptive connections), and
        /// the sample of now (its connections are set here).
        var tuner: ConnectionTuner? = nil
        var sample = ConnectionTuner.Sample(time: 0, cpu: 0, bytes: 0, connections: 0)
    }

    /// What a range's answer comes to.
    enum RangeAnswered {
        /// Its body is not read (its range was dropped, its source retired or refused).
        case stop(SinkStop)
        /// It disagrees with the others and none can be refused: the file changed.
        case changed(String)
        /// Its body is written through `cursor` (moved into the cursor file if it was not there).
        case write(Writing)
    }

    /// What the engine does before the body of a range's answer is written.
    struct Writing {
        var cursor: SegmentCursor
        /// This answer decided on the connections: wake the run (and open more when `openMore`).
        var decided = false
        var openMore = false
        /// The file's complete length, to preallocate, when this answer decided.
        var preallocate: Int64?
        /// The tuner started: the monitor samples often.
        var tuning = false
        /// The record's description changed (the control file is stored before the body when there is none).
        var described = false
        /// The target is to be chosen now (from the head: the first description, or a finished file's check).
        var nameTarget = false
    }

    /// A valid 206 to a range: dropped, retired and disagreeing answers stop before anything
    /// changes; else the held bytes are confirmed (`If-Range`), the URL given's first answer
    /// names its mirrors, the writer moves into the cursor file, the record and the ranges learn
    /// the answer (``partialResponse(segment:at:end:total:validators:source:connection:digest:connections:)``),
    /// and the round's first answer decides on more connections and the tuner.
    mutating func rangeAnswered(_ a: RangeAnswer) -> RangeAnswered {
        answered(after: a.latency)
        if isDropped(a.cursor) { return .stop(.nothingToRead) }
        // A source retired meanwhile (by another connection) writes nothing more.
        if sources.isRetired(a.source) { return .stop(.rejected(reason: "it was retired")) }
        if sources.several, let why = disagreement(source: a.source, total: a.total, validators: a.validators) {
            return sources.canReject(a.source) ? .stop(.rejected(reason: why)) : .changed(why)
        }
        if a.confirming { heldBytesConfirmed() }
        // Metalink/HTTP (RFC 6249): the first answer names the file's mirrors.
        if a.source == 0, record.validators == nil {
            for m in a.mirrors { addMirror(m, connections: a.connections) }
        }
        var cursor = a.cursor
        if cursorFile != nil, !cursor.isMapped {
            // From now on this range's progress is kept in the cursor file.
            cursor = self.cursor(cursor.segment, start: cursor.start, position: cursor.position.load(ordering: .relaxed),
                                 end: cursor.end.load(ordering: .relaxed))
            writes(cursor)
        }
        let decided = partialResponse(segment: cursor.segment, at: a.at, end: a.end, total: a.total, validators: a.validators,
                                      source: a.source, connection: a.connection, digest: a.digest,
                                      connections: connectionsAllowed(a.connections))
        lowerEnd(of: cursor)
        var w = Writing(cursor: cursor, described: decided.described)
        if let total = decided.decidedTotal {
            w.decided = true
            w.preallocate = total
            if let running = decided.running, running > 1 {
                if let t = a.tuner, tuner == nil {
                    var sample = a.sample
                    sample.connections = running
                    startTuning(t, with: sample)
                    w.tuning = true
                }
                w.openMore = true
            }
        }
        w.nameTarget = (decided.described || a.conditional) && (record.target == nil || a.conditional)
        responseBegan(a.connection, from: a.at, source: a.source, cursor: w.cursor)
        return .write(w)
    }

    /// What a whole response (a 200) to a range request comes to, before anything of it is written.
    enum WholeAnswered: Equatable {
        /// Its body is not read: its range was dropped for another whole response, or its source
        /// was retired, or it is a mirror that does not take ranges while others are live.
        case stop(SinkStop)
        /// It replaces every held byte (``FileDownload/discardHeld(_:reset:)``). `othersRunning`:
        /// other ranges run, to be stopped first (``writeAlone(keeping:connection:)``), and `why`
        /// says why the server may have done so; nil when it is the only range.
        case replace(othersRunning: Bool, why: String?)
    }

    /// A whole response (a 200) from `source` to the range request `cursor` made from `offset`
    /// (``ResponseDecision/replace(total:validators:)``), read with the staleness in one step: a
    /// response for a range that another 200 has already replaced (and so made the ranges one) is
    /// not taken for the only range.
    func wholeAnswered(cursor: SegmentCursor, source: Int, offset: Int64, validators: Validators) -> WholeAnswered {
        if isDropped(cursor) { return .stop(.nothingToRead) }
        // A mirror that does not take ranges (or whose file changed) leaves; the others go on.
        if sources.isRetired(source) || sources.several && sources.canReject(source) && (offset > 0 || record.totalLength != nil) {
            return .stop(.rejected(reason: "it sent the whole file (200) to a range request", otherFile: false))
        }
        guard record.segments.count > 1 || cursor.segment != 0 else { return .replace(othersRunning: false, why: nil) }
        let why = sources.several
            ? "the file seems to have changed, and no source that answered before says otherwise"
            : record.validators == validators
            ? "it did not take the range: an FTP server refusing REST, a server that ignores ranges at times"
            : "its validators differ from the other responses': a load balancer whose servers disagree?"
        return .replace(othersRunning: true, why: why)
    }

    /// The whole response's body is written from byte 0 through a new cursor, connection
    /// `connection` owning the one range (of `total` bytes, when known).
    mutating func wholeTaken(total: Int64?, by connection: Int, source: Int, latency: Double) -> SegmentCursor {
        answered(after: latency)
        if let total { lengthKnown(total, claiming: 0, by: connection) }
        let fresh = cursor(0, start: 0, position: 0, end: total)
        writes(fresh)
        responseBegan(connection, from: 0, source: source, cursor: fresh)
        return fresh
    }

    /// Why a 206 from `source` cannot be part of this file when there are several sources: another
    /// complete length, or validators that differ from that source's earlier answers.
    func disagreement(source: Int, total: Int64?, validators: Validators) -> String? {
        if let known = record.totalLength, let total, known != total {
            return "its length (\(total)) is not the file's (\(known))"
        }
        if let held = record.validators(of: source), !held.consistent(with: validators) {
            return "its validators changed (its file changed?)"
        }
        return nil
    }

    // MARK: - The search for a bad source

    /// Where the search for a source whose bytes break the whole-file hash stands
    /// (``FileDownload/searchForTheBadSource(file:)``).
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

    /// The search, while one runs.
    private(set) var search: BadSourceSearch?
    /// A whole-file hash already checked against every byte held (the finish need not read them again).
    private(set) var preVerified: ExpectedDigest?

    /// Every byte held matched the whole-file hash `expected`: the finish need not read them again,
    /// and a search ends by naming the source it suspended last (rejected). The notice to show, if any.
    mutating func hashMatched(_ expected: ExpectedDigest) -> String? {
        preVerified = expected
        defer { search = nil }
        guard let bad = search?.current else { return nil }
        let url = DownloadURL.redacted(sources.sources[bad].url)
        suspend(nil)
        let notice = reject(bad, why: "its bytes did not match the \(expected.algorithm.rawValue) hash; its share was fetched from the others")
        return notice ?? "mirror \(url) sent bytes that do not match the \(expected.algorithm.rawValue) hash"
    }

    /// Every byte held failed the whole-file hash: what to fetch again, from the other sources.
    /// First (source -1) the bytes whose source is not known (written before a kill); then, one
    /// round each, the share of every source that wrote in this run, the largest first, that
    /// source suspended meanwhile (a source that first writes during the search joins the end of
    /// the line), with what to say of it (`algorithm`: the hash's name). Nil when no suspect is
    /// left whose share another live source can fetch.
    mutating func hashFailed(algorithm: String) -> Suspect? {
        guard let (source, ranges) = nextSuspect() else { return nil }
        let bytes = ByteCount.format(ranges.reduce(Int64(0)) { sum, r in
            let (s, overflow) = sum.addingReportingOverflow(r.end - r.start)
            return overflow ? .max : s
        })
        let notice = source < 0
            ? "the file does not match its \(algorithm) hash; fetching again the \(bytes) whose source is not known (written before a kill), "
                + "to find the source that sent other bytes"
            : "the file does not match its \(algorithm) hash; fetching the \(bytes) that \(DownloadURL.redacted(sources.sources[source].url)) "
                + "sent from the other sources"
        return Suspect(source: source, ranges: ranges, notice: notice)
    }

    /// A source suspected of the whole-file hash's failure (-1: the bytes whose source is not
    /// known), the ranges it wrote, to fetch again from the others, and what to say.
    struct Suspect {
        let source: Int
        let ranges: [(start: Int64, end: Int64)]
        let notice: String
    }

    private mutating func nextSuspect() -> (source: Int, ranges: [(start: Int64, end: Int64)])? {
        var s = search ?? BadSourceSearch(suspects: nil, current: nil)
        suspend(nil)
        if s.suspects == nil {
            let unknown = unattributed(total: record.totalLength ?? 0)
            if search == nil, !unknown.isEmpty {
                search = s
                return (-1, unknown)
            }
            s.suspects = []
        }
        for w in writersByShare where !s.tried.contains(w) && s.suspects?.contains(w) == false { s.suspects?.append(w) }
        for source in sources.sources.indices {
            s.written[source] = Self.merged((s.written[source] ?? []) + written(by: source))
        }
        // A suspect whose share another live source can fetch.
        guard let i = s.suspects?.firstIndex(where: { c in sources.live.contains { $0 != c } }) else {
            search = s
            return nil
        }
        let source = s.suspects!.remove(at: i)
        s.tried.insert(source)
        s.current = source
        search = s
        suspend(source)
        return (source, s.written[source] ?? [])
    }

    // MARK: - The connection tuner

    /// The connection tuner (``ConnectionTuner``), once a round's first response allowed several
    /// connections and the options want one.
    private(set) var tuner: ConnectionTuner?

    /// Whether the tuner is still deciding.
    var tuning: Bool { tuner.map { $0.phase != .settled } ?? false }

    /// The tuner starts (once a run), with the sample of the first response's connections.
    mutating func startTuning(_ tuner: ConnectionTuner, with sample: ConnectionTuner.Sample) {
        guard self.tuner == nil else { return }
        self.tuner = tuner
        _ = self.tuner?.add(sample)
    }

    /// What the engine carries out of the tuner's decision (the data path's trial, the gate, a notice).
    enum Tuned: Equatable {
        /// The trial holds every connection but `keeper`'s: the data path's trial is `keeper`,
        /// its bytes counted from zero.
        case trial(keeper: Int)
        /// The held connections read on: the trial ends and the gate opens.
        case restored
        /// The shed stands (the held ranges end where they are): the trial ends; `from`
        /// connections added no speed.
        case keptShed(from: Int?)
    }

    /// One tuner sample (`sample`: every connection's bytes; its connections, those whose writers
    /// bring bytes, counted here from `writers`), carried out on the connections:
    /// during a trial (`trialBytes`, the data path's count of the kept connection's bytes; nil
    /// when no trial runs) only those count, as one connection. Returns the tuner's action (for
    /// ``DownloadOptions/onTune``) and what the engine does, if anything.
    mutating func tunerSampled(_ sample: ConnectionTuner.Sample, trialBytes: Int64?, writers: [Int: Writer])
        -> (action: ConnectionTuner.Action?, then: Tuned?)
    {
        guard tuning else { return (nil, nil) }
        var sample = sample
        if let trialBytes {
            sample.connections = 1
            sample.bytes = trialBytes
        } else if let s = scheduler {
            // The connections that bring bytes: a range with an owner whose writer has written
            // since it began (the tuner's warmup waits for all of them).
            sample.connections = writers.filter { i, w in s.segments.indices.contains(i) && s.segments[i].owner != nil && w.position > w.beganAt }.count
        } else {
            sample.connections = activeConnections
        }
        let action = tuner?.add(sample)
        switch action {
        case .shed?: return (action, holdConnections(writers: writers).map { .trial(keeper: $0) })
        case .restore?:
            connectionsRestored()
            return (action, .restored)
        case .keepShed?:
            shedConnections(writers: writers)
            return (action, .keptShed(from: tuner?.shedFrom))
        case nil: return (nil, nil)
        }
    }

    // MARK: - The projection

    private mutating func rebuildRanges(claiming segment: Int?, by owner: Int = 0) {
        guard let total = record.totalLength else {
            scheduler = nil
            return
        }
        var s = SegmentScheduler(total: total, records: record.segments, minSplit: minSplit)
        if let segment, s.segments.indices.contains(segment) { s.claim(segment, by: owner) }
        scheduler = s
        project()
    }

    /// The record's ranges from the scheduler's: same starts and ends, durable counts kept (a
    /// range cut short keeps at most its new length).
    private mutating func project() {
        guard let s = scheduler else { return }
        var segments = record.segments
        for (i, seg) in s.segments.enumerated() {
            if i < segments.count {
                segments[i].start = seg.start
                segments[i].end = seg.end
                segments[i].done = min(segments[i].done, seg.end - seg.start)
            } else {
                segments.append(SegmentRecord(start: seg.start, end: seg.end, done: 0))
            }
        }
        if segments.count > s.segments.count { segments.removeLast(segments.count - s.segments.count) }
        if segments != record.segments { checkpoints.update { $0.segments = segments } }
    }
}
