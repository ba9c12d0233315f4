/// One connection's life, as a machine: ``FileDownload/connection(_:file:conditional:)`` reports
/// what happened (an event) and runs what the run's state says to do next (an action), one lock
/// take per event. Nothing here does I/O or waits.
///
///     opens ──▶ fetch(range) ──rangeDone──▶ fetch | wait(s) ──waited──▶ …
///                    │ rangeCut ──▶ fetch (a range no one has) | stop
///                    │ retired / ended(early) ──▶ stop
///     out of work ──▶ waitForRestore (held by the tuner) ──restored──▶ fetch | … | stop
extension RunState {
    /// What happened to connection `id`.
    enum ConnectionEvent {
        /// It opens: it asks the source whose URL `finishedAt` is (a finished file's check), else
        /// as ``connectionStarted(_:asking:)`` allows.
        case opens(finishedAt: String?)
        /// Its range is done: it takes more, or waits in the endgame.
        case rangeDone
        /// Its range is done and its connection closed (the response was cut short: another took
        /// the rest): it takes only a range no connection has.
        case rangeCut
        /// Its endgame wait is over: it asks again.
        case waited
        /// The held connections are brought back (``ConnectionTuner``).
        case restored
        /// Its source is gone and no other has room, or another goes on alone.
        case retired
        /// Its first answer made fetching unnecessary (a finished file unchanged, a Metalink
        /// document): the run ends so.
        case ended(Transferred)
    }

    /// What connection `id` does next.
    enum ConnectionAction {
        /// Fetches this range (its writer registered). `asked`: the first connection, on opening,
        /// asks the source the finished file's check is for (else the check is not made).
        case fetch(SegmentCursor, asked: Bool)
        /// The endgame: waits this long (then ``ConnectionEvent/waited``).
        case wait(Double)
        /// Held by the tuner: waits for the others to be brought back (then ``ConnectionEvent/restored``).
        case waitForRestore
        /// Leaves (``connectionLeft(_:)`` follows).
        case stop
        /// Never opened: no source has room (nothing to leave).
        case none
    }

    /// Applies `event` of connection `id` and says what it does next.
    mutating func connection(_ id: Int, _ event: ConnectionEvent, now: Double, connections: Int) -> ConnectionAction {
        switch event {
        case .opens(let finishedAt):
            guard let start = connectionStarts(id, finishedAt: finishedAt) else { return .none }
            // (The first connection makes a finished file's check, the others fetch shares.)
            if id == 0 { return .fetch(firstWriter(), asked: start.asked) }
            return next(id, work(for: id, now: now, connections: connections))
        case .rangeDone, .waited:
            return next(id, work(for: id, endgame: true, now: now, connections: connections))
        case .rangeCut:
            // A new connection is opened only for a range no connection has: taking part of
            // another's would cut that one's response in turn (a new TCP and TLS handshake each
            // time, for the last few megabytes).
            guard case .range(let c) = work(for: id, unownedOnly: true, now: now, connections: connections) else { return .stop }
            return .fetch(c, asked: false)
        case .restored:
            return next(id, work(for: id, now: now, connections: connections))
        case .retired:
            return .stop
        case .ended(let early):
            ended(early: early)
            return .stop
        }
    }

    /// The action for `work`: out of it, a connection the tuner holds waits to be brought back.
    private func next(_ id: Int, _ work: Work, asked: Bool = false) -> ConnectionAction {
        switch work {
        case .range(let c): .fetch(c, asked: asked)
        case .wait(let seconds): .wait(seconds)
        case .none: waitsForRestore(id) ? .waitForRestore : .stop
        }
    }

    /// What connection `id` does after a counted failure at `source` (its ``Attempt`` decides,
    /// then, with several sources, the sources: a busy one takes no more, a failing one is left
    /// for another with room, one that keeps failing is retired), in one look at the run.
    enum AfterFailure: Equatable {
        /// Waits this long (a checkpoint first), then asks again.
        case backOff(Double)
        /// Goes on at once with this other source.
        case moveTo(Int)
        /// Leaves its range to the others.
        case leave
        /// The download fails.
        case fail(PickupError)
    }

    /// Decides what connection `id` does after `failure` at `source` (`facts` as the attempt's
    /// outcome was decided with, `jitter` in 0...1 for the backoff); returns that and what to say.
    mutating func failed(_ failure: Attempt.Failure, connection id: Int, source: Int, attempt: inout Attempt,
                         facts: Attempt.Facts, jitter: Double) -> (AfterFailure, notices: [String]) {
        var notices: [String] = []
        var next = attempt.failed(failure, connection: id, facts: facts, jitter: jitter)
        if case .askSources(let f, let tooLong) = next {
            let (answer, notice) = attemptFailed(source: source, connection: id, f, tooLong: tooLong)
            if let notice { notices.append(notice) }
            switch answer {
            case .retry:
                next = attempt.afterSources(f, connection: id, facts: facts, jitter: jitter)
            case .moveTo(let to):
                return (.moveTo(to), notices)
            case .leave:
                if !f.busy { notices.append(Attempt.retired(id, f.message)) }
                return (.leave, notices)
            }
        }
        switch next {
        case .askSources: return (.backOff(0), notices)  // (answered above: not reached)
        case .leave(let notice): return (.leave, notices + [notice])
        case .fail(let error): return (.fail(error), notices)
        case .backOff(let delay, let notice): return (.backOff(delay), notices + [notice])
        }
    }
}
