/// The servers one file comes from, and which connection asks which: a value-type state machine
/// with no I/O, kept in ``RunState`` and driven by ``FileDownload``.
///
/// Source 0 is the URL the user gave first; the others are its mirrors (more URLs, a Metalink
/// file's, a `Link: rel=duplicate` field's). What is durable about a source (its validators,
/// why it was rejected) lives in the control record (``ControlRecord/mirrors``); this holds what
/// one run observes: connections per source, the most it accepts, failures, speed, bad pieces.
///
/// Rules: a connection is bound to one source at a time; a source never has more connections
/// than its cap (lowered by a 503 or a server's "too many connections"); a new connection goes
/// to the source that gives most per connection (an untried one first, so every mirror is
/// measured), never one that sent a bad piece while a clean one has room; a source that keeps
/// failing, or sends other bytes, is retired while another is live; the last live source is
/// never retired (it keeps the whole retry budget).
struct SourceSet: Equatable {
    struct Source: Equatable {
        /// The URL as given (and as recorded).
        var url: String
        /// Where its redirects last led (further requests start there).
        var resolved: String
        /// Connections bound to it.
        var connections: Set<Int> = []
        /// The most connections it takes now.
        var cap: Int
        /// Attempts in a row that failed.
        var failures = 0
        /// Pieces it sent that failed their hash.
        var badPieces = 0
        /// Speed per connection, bytes per second (smoothed), once measured.
        var rate: Double?
        /// Whether it has sent a byte of the file in this run.
        var delivered = false
        /// Whether it turned a lone connection away (busy) since it last delivered bytes.
        var turnedAway = false
        /// The bound connections it answered with the file (a 206 taken) while bound.
        var answered: Set<Int> = []
        /// The most connections it answered at once: a busy answer never lowers its cap below.
        var proven = 0
        /// Why it takes no more requests (nil: live).
        var retired: String?
    }

    private(set) var sources: [Source]
    /// The source each connection is bound to.
    private(set) var binding: [Int: Int] = [:]
    /// Failures in a row after which a source is retired (when another is live).
    static let failuresToRetire = 2
    /// Bad pieces after which a source is retired (when another is live).
    static let badPiecesToRetire = 2

    /// The sources `urls` (the first is the primary), each taking at most `connections`.
    init(urls: [String], connections: Int) {
        var seen = Set<String>()
        sources = urls.filter { seen.insert($0).inserted }.map { Source(url: $0, resolved: $0, cap: max(1, connections)) }
    }

    /// More than one source: every source is its own server.
    var several: Bool { sources.count > 1 }
    var live: [Int] { sources.indices.filter { sources[$0].retired == nil } }

    func source(of connection: Int) -> Int? { binding[connection] }
    func url(_ source: Int) -> String { sources[source].resolved }
    func isRetired(_ source: Int) -> Bool { sources[source].retired != nil }

    /// Adds a mirror learnt along the way (a `Link: rel=duplicate` field); returns its index, or
    /// nil when it is already known or there are enough.
    mutating func add(_ url: String, connections: Int) -> Int? {
        guard sources.count < 64, !sources.contains(where: { $0.url == url }) else { return nil }
        sources.append(Source(url: url, resolved: url, cap: max(1, connections)))
        return sources.count - 1
    }

    /// The best live source with room for one more connection, other than `avoiding`: a clean
    /// one (no bad piece) before any other, an untried one first, then the most per connection,
    /// then the fewest connections, then as given.
    func pick(avoiding: Int? = nil) -> Int? {
        let open = live.filter { $0 != avoiding && sources[$0].connections.count < sources[$0].cap }
        let clean = open.filter { sources[$0].badPieces == 0 }
        return (clean.isEmpty ? open : clean).max { a, b in
            let (ra, rb) = (sources[a].rate ?? .infinity, sources[b].rate ?? .infinity)
            if ra != rb { return ra < rb }
            let (ca, cb) = (sources[a].connections.count, sources[b].connections.count)
            if ca != cb { return ca > cb }
            return a > b
        }
    }

    /// Binds `connection` to ``pick(avoiding:)``; nil (and unbound) when no source has room.
    @discardableResult
    mutating func bind(_ connection: Int) -> Int? {
        unbind(connection)
        guard let best = pick() else { return nil }
        bind(connection, to: best)
        return best
    }

    /// The endgame: `connection` takes over the rest of a range stalled on `slow`. Asking the same
    /// server again for it is the last resort: it moves to the best other source with room, if
    /// one has. Returns the source it moved to.
    @discardableResult
    mutating func takeOver(_ connection: Int, from slow: Int) -> Int? {
        guard several, binding[connection] == slow, let to = pick(avoiding: slow) else { return nil }
        bind(connection, to: to)
        return to
    }

    /// Binds `connection` to `source` (the first connection asks the primary), over its cap if need be.
    mutating func bind(_ connection: Int, to source: Int) {
        unbind(connection)
        sources[source].connections.insert(connection)
        binding[connection] = source
    }

    mutating func unbind(_ connection: Int) {
        if let s = binding.removeValue(forKey: connection) {
            sources[s].connections.remove(connection)
            sources[s].answered.remove(connection)
        }
    }

    /// A redirect of `source` led to `url`.
    mutating func redirected(_ source: Int, to url: String) { sources[source].resolved = url }

    /// An attempt on `source` moved `bytes` in `seconds`: it is working.
    mutating func measured(_ source: Int, bytes: Int64, seconds: Double) {
        guard bytes > 0 else { return }
        sources[source].failures = 0
        sources[source].turnedAway = false
        sources[source].delivered = true
        guard seconds > 0.05 else { return }
        let r = Double(bytes) / seconds
        sources[source].rate = sources[source].rate.map { 0.5 * $0 + 0.5 * r } ?? r
    }

    /// What a connection does after its source failed.
    enum Next: Equatable {
        /// Try the same source again (after the usual backoff).
        case retry
        /// Go on at once with this other source.
        case moveTo(Int)
        /// No source has room for it: the connection leaves (its range goes to the others).
        case leave
    }

    /// `source` takes no more connections (a 503, a 429, FTP's 421): its cap is what it had
    /// without `connection`, which moves to another source with room, or leaves when others are
    /// fetching. Alone on its source, it waits and retries.
    /// The notice when the cap went down is ``capNotice(_:)``. Alone on its source, the connection
    /// waits and asks again (a busy server is alive: it may still count a killed run's connections,
    /// or be full for a moment); still turned away, it has failed like any other (counted, so that
    /// two sources that keep refusing cannot pass it back and forth without end):
    /// ``failed(_:connection:why:)``.
    mutating func busy(_ source: Int, connection: Int, othersFetching: Bool, why: String) -> (next: Next, retired: String?) {
        let others = sources[source].connections.subtracting([connection]).count
        guard others > 0 else {
            if !several { return (othersFetching ? .leave : .retry, nil) }
            // (Bound meanwhile, the waiting connection keeps the others from asking it too.)
            if !sources[source].turnedAway {
                sources[source].turnedAway = true
                return (.retry, nil)
            }
            return failed(source, connection: connection, why: why)
        }
        // A server that answered N at once and turns one away while fewer run is still counting a
        // connection just closed (a range cut short): its cap stays at what it proved, and the
        // refused connection goes elsewhere or leaves. (Even-pacing mirrors of 2 went down to 1
        // this way: 5 connections of 6 for the rest of the file.)
        sources[source].cap = max(others, min(sources[source].cap, sources[source].proven))
        if let away = elsewhere(connection, from: source) { return (away, nil) }
        unbind(connection)
        return (.leave, nil)
    }

    /// `connection` moves to the best other source than `source` with room, if there is one.
    private mutating func elsewhere(_ connection: Int, from source: Int) -> Next? {
        guard let to = pick(avoiding: source) else { return nil }
        bind(connection, to: to)
        return .moveTo(to)
    }

    /// What to say of `source`'s cap (after a busy answer lowered it).
    func capNotice(_ source: Int) -> String {
        "mirror \(DownloadURL.redacted(sources[source].url)) takes \(sources[source].cap) connection\(sources[source].cap == 1 ? "" : "s") at most"
    }

    /// An attempt on `source` failed (`why`): after ``failuresToRetire`` in a row the source is
    /// retired when another is live, and the connection moves on. Returns the retirement notice, if any.
    mutating func failed(_ source: Int, connection: Int, why: String) -> (next: Next, retired: String?) {
        sources[source].failures += 1
        guard several else { return (.retry, nil) }
        // One that has sent nothing while another has (a dead mirror) goes at its first failure.
        let limit = !sources[source].delivered && sources.contains(where: \.delivered) ? 1 : Self.failuresToRetire
        if sources[source].failures >= limit, let retired = retire(source, moving: connection, why: why) { return retired }
        // Another source with room takes the retry at once; this one may recover meanwhile.
        return (elsewhere(connection, from: source) ?? .retry, nil)
    }

    /// `source` is retired (``retire(_:why:)``) and `connection` goes on with the best source with
    /// room, or leaves; nil (nothing changed) when `source` stays.
    mutating func retire(_ source: Int, moving connection: Int, why: String) -> (next: Next, retired: String?)? {
        guard let notice = retire(source, why: why) else { return nil }
        return (bind(connection).map { .moveTo($0) } ?? .leave, notice)
    }

    /// Whether `source`'s bytes may be refused for another source's: another live one has
    /// answered with this file in this run. (After a change everywhere, the first to answer with
    /// the new file is the file; a mirror that was never reached proves nothing.)
    func canReject(_ source: Int) -> Bool {
        live.contains { $0 != source && sources[$0].delivered }
    }

    /// `source` answered with this file (a 206 whose length and validators were taken).
    mutating func accepted(_ source: Int, connection: Int? = nil) {
        sources[source].delivered = true
        guard let connection, sources[source].connections.contains(connection) else { return }
        sources[source].answered.insert(connection)
        sources[source].proven = max(sources[source].proven, sources[source].answered.count)
    }

    /// `source` cannot serve this file (another length, a 404, a changed file, no ranges, too
    /// many failures): it is retired when another live one has answered with this file or has not
    /// failed yet. Returns the notice, or nil when it stays.
    mutating func retire(_ source: Int, why: String) -> String? {
        guard sources[source].retired == nil else { return nil }
        guard live.contains(where: { $0 != source && (sources[$0].delivered || sources[$0].failures == 0) }) else { return nil }
        sources[source].retired = why
        return "mirror \(DownloadURL.redacted(sources[source].url)) retired: \(why)"
    }

    /// `source` is known not to be this file (another length than the request's): retired while
    /// any other source is live, however that one has fared. Nil when it is the last live one.
    mutating func retireOtherFile(_ source: Int, why: String) -> String? {
        guard sources[source].retired == nil else { return "" }
        guard live.contains(where: { $0 != source }) else { return nil }
        sources[source].retired = why
        return "mirror \(DownloadURL.redacted(sources[source].url)) retired: \(why)"
    }

    /// A piece `source` sent failed its hash: counted; returns whether it has sent
    /// ``badPiecesToRetire`` (then it should be rejected).
    mutating func badPiece(_ source: Int) -> Bool {
        sources[source].badPieces += 1
        return sources[source].badPieces >= Self.badPiecesToRetire
    }

    /// `source` takes no requests while its share of a file whose hash failed is fetched from
    /// the others (``FileDownload/searchForTheBadSource(file:)``); nil lifts it.
    mutating func suspend(_ source: Int?) {
        for i in sources.indices where sources[i].retired == Self.suspected { sources[i].retired = nil }
        if let source, sources[source].retired == nil { sources[source].retired = Self.suspected }
    }
    static let suspected = "suspected of sending other bytes"

    /// Sources start a new round of connections: caps and failures are forgotten, retirements kept
    /// (and what each proved it takes at once).
    mutating func newRound(connections: Int) {
        binding = [:]
        for i in sources.indices {
            sources[i].connections = []
            // (Kept, the last round's connections counted again with this round's: a source
            // that answered 2 and then 1 proved 3, and a busy answer could not lower its cap to 2.)
            sources[i].answered = []
            sources[i].cap = max(1, connections)
            sources[i].failures = 0
            sources[i].turnedAway = false
        }
    }
}
