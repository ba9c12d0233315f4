import Foundation

/// What a response head means for the download, on the transport's thread before its body is
/// written: the first valid 206 plans the ranges and opens more connections, a 200 replaces
/// every held byte; the record learns validators, length and name.
extension FileDownload {
    /// Applies a decision on a response head. Returns the cursor, offset and response end to write
    /// the body with, or nil when the body is not file content. On `BlockingIO`'s head threads (the
    /// transport calls the sink's head there, never on its event loop); the file-system calls it
    /// needs (the cursor file's mapping, preallocation, a truncation for a 200, the control file)
    /// run outside the state's lock.
    func beginWriting(decision: ResponseDecision, head: ResponseHead, context: RequestContext,
                      cursor: SegmentCursor, latency: Double, connection: Int, source: Int = 0) throws -> (SegmentCursor, Int64, Int64?)? {
        if decision.writes {
            if answersWithMetalink(head, source: source) { throw SinkStopped(.metalink) }
            discardForeign()
        }
        switch decision {
        case .append(let at, let end, let total, let validators):
            mapCursorsIfLarge(total: total, orRecorded: true)
            var answer = RunState.RangeAnswer(cursor: cursor, at: at, end: end, total: total, validators: validators, source: source,
                                              connection: connection, digest: Self.serverDigest(head), latency: latency,
                                              confirming: context.validators?.ifRange != nil, conditional: context.conditional,
                                              mirrors: source == 0 ? LinkHeader.duplicates(head.values("Link")).map(\.url) : [],
                                              connections: options.connections)
            if options.adaptiveConnections {
                var tuner = ConnectionTuner(threads: options.transportThreads)
                if let share = options.tunerKeepShare { tuner.keepShare = share }
                answer.tuner = tuner
            }
            var more: AsyncStream<Void>.Continuation? = nil
            var soon = false
            var preallocate: (PartialFile, Int64)? = nil
            var naming: Naming? = nil  // set when this answer names the target
            let (writing, result) = try state.withLockedValue { state throws -> (RunState.Writing?, (SegmentCursor, Int64, Int64?)?) in
                guard let file else {
                    state.answered(after: latency)
                    return (nil, nil)
                }
                // (A tuner yet to start, by an answer that may decide: getrusage only then.)
                if answer.tuner != nil, state.tuner == nil, !state.connectionsDecided { answer.sample = tunerSample() }
                switch state.rangeAnswered(answer) {
                case .stop(let why): throw SinkStopped(why)
                case .changed(let why): throw RepresentationChanged(reason: why)
                case .write(let w):
                    if let total = w.preallocate, options.preallocate { preallocate = (file, total) }
                    // The first valid 206 of this run (fresh or resumed) decides whether more connections open.
                    if w.decided { more = state.wake }
                    if w.nameTarget { naming = Naming(state) }
                    if w.described || context.conditional { soon = state.wantsStoreSoon }
                    return (w, (w.cursor, at, end))
                }
            }
            if writing?.tuning == true { monitor.sampleOften() }
            // Named before the preallocation (a file at `-o NAME` that appeared since the start
            // stops the run before it waits on, or fails for, the disk space), and stored with it.
            if let naming {
                let target = try targetPath(head: head, naming)
                soon = state.withLockedValue { state in
                    state.named(target, replacing: context.conditional)
                    return state.wantsStoreSoon
                }
            }
            if let (file, total) = preallocate, try file.size() < total { try file.preallocate(total) }
            if writing?.openMore == true { more?.yield() }
            more?.finish()
            if soon { storeBeforeFirstByte() }
            return result
        case .replace(let total, let validators):
            guard let file else { return nil }
            let answered = state.withLockedValue { $0.wholeAnswered(cursor: cursor, source: source, offset: context.offset, validators: validators) }
            switch answered {
            case .stop(let why):
                throw SinkStopped(why)
            case .replace(true, let why):
                // A whole response from offset 0 while other ranges run (their validators did not
                // match this server's: a load balancer's backends, a changed file): it is the one
                // stream from now on. The others stop before any byte of it is written.
                switch stopOthers(but: cursor, connection: connection) {
                case .stopped: break
                case .stale: throw SinkStopped(.nothingToRead)
                case .timedOut: throw RepresentationChanged(reason: "the server sent the whole file (200) to a range request")
                }
                onEvent(.notice("the server sent the whole file (200) to a range request (\(why ?? "")); the held bytes are discarded "
                    + "and this response is kept, over one connection"))
            case .replace(false, _) where context.offset > 0:
                onEvent(.notice("the server sent the whole file (200) instead of the rest; the held bytes are discarded"))
            case .replace: break
            }
            mapCursorsIfLarge(total: total)
            try discardHeld(file) { r in
                r.setValidators(validators, of: source)
                r.totalLength = total
                r.segments = [SegmentRecord(start: 0, end: total, done: 0)]
                r.serverDigest = Self.serverDigest(head)
            }
            let naming = state.withLockedValue { $0.record.target == nil || context.conditional ? Naming($0) : nil }
            let target = try naming.map { try targetPath(head: head, $0) }
            let (fresh, more, soon) = state.withLockedValue { state -> (SegmentCursor, AsyncStream<Void>.Continuation?, Bool) in
                if let target { state.named(target, replacing: context.conditional) }
                return (state.wholeTaken(total: total, by: connection, source: source, latency: latency), state.wake, state.wantsStoreSoon)
            }
            more?.finish()
            if soon { storeBeforeFirstByte() }
            return (fresh, 0, total)
        default:
            state.withLockedValue { $0.answered(after: latency) }
            return nil
        }
    }

    /// A source whose answer announces another length than the one the request gives (a Metalink
    /// document's `size`) is not this file, whatever answered first: it is retired while another
    /// source is live (``SinkStop/rejected(reason:otherFile:)``), else the download fails
    /// (``RunState/lengthAnnounced(_:expected:source:)``); alone and announcing none, it is taken,
    /// and the finished file must have the length.
    func checkLength(of decision: ResponseDecision, expected: Int64, source: Int) throws {
        let announced: Int64?
        switch decision {
        case .append(_, _, let total, _), .replace(let total, _): announced = total
        default: return
        }
        switch state.withLockedValue({ $0.lengthAnnounced(announced, expected: expected, source: source) }) {
        case .fits:
            return
        case .fails(let why, let url):
            throw PickupError.verification("\(DownloadURL.redacted(url)) is not the file the Metalink document describes: \(why)")
        case .rejected(let why, let notice):
            if !notice.isEmpty { onEvent(.notice(notice)) }  // (empty: another connection retired it)
            throw SinkStopped(.rejected(reason: why))
        }
    }

    enum Stop { case stopped, stale, timedOut }

    /// Every range but `keep`'s stops where its writer is (``RunState/writeAlone(keeping:connection:)``),
    /// no other connection gets work for the rest of the run, and this returns once no other writer is
    /// inside a chunk (so none writes after the held bytes are discarded): `.stopped`. `.stale`
    /// when another response got there first (`keep` was stopped), `.timedOut` when a writer
    /// stayed inside a chunk for 2 s.
    func stopOthers(but keep: SegmentCursor, connection: Int) -> Stop {
        guard let others = state.withLockedValue({ $0.writeAlone(keeping: keep, connection: connection) }) else { return .stale }
        // A writer inside a chunk is in one pwrite: it leaves within microseconds, or within a
        // slow disk's milliseconds. Looked at again every 50 µs, on the head's `BlockingIO`
        // thread, never on an event loop.
        let deadline = Clock.monotonic() + 2
        for c in others {
            while c.writing.load(ordering: .sequentiallyConsistent) {
                if Clock.monotonic() > deadline { return .timedOut }
                usleep(50)
            }
        }
        return .stopped
    }

    static func serverDigest(_ head: ResponseHead) -> ExpectedDigest? {
        DigestHeader.expected(reprDigest: head.combined("Repr-Digest"), digest: head.combined("Digest"))
    }
}
