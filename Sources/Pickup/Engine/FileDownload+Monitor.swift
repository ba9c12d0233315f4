import Foundation

/// The periodic side of a run, driven by the ``DownloadMonitor``'s ticks: progress reports,
/// checkpoints and write-behind queued on the blocking-I/O pool, and the connection tuner.
extension FileDownload {
    /// Starts progress reports, checkpoints and tuner samples (see ``DownloadMonitor``).
    func startMonitoring() {
        ticks.withLockedValue { $0.start(now: Clock.monotonic()) }
        monitor.add(self)
    }

    /// Stops them; returns once a tick in progress has ended, so that nothing is reported or
    /// checkpointed behind the caller's back.
    func stopMonitoring() {
        monitor.remove(self)
        ticks.withLockedValue { $0.monitored = false }
    }

    /// One tick of the monitor: reports progress every `progressInterval` (give or take a tenth:
    /// ticks are shared by all downloads), checkpoints every `checkpointInterval` (at the first
    /// tick after it), and feeds the tuner. Returns whether the tuner is still deciding (then ticks come every
    /// ``ConnectionTuner/step``; only in the first second, where deciding early pays).
    func tick(now: Double) -> Bool {
        ticks.withLockedValue { ticks in
            guard ticks.monitored else { return false }
            let due = ticks.tick(now: now, written: transferred.load(ordering: .relaxed))
            if let speed = due.progress {
                let (held, total, patience, connections) = state.withLockedValue { state in
                    (state.heldBytes, state.record.totalLength, state.patience.values.max() ?? 0, state.activeConnections)
                }
                let stall = patience > 0 ? transport.stallTimeout(patience: patience) : nil
                onEvent(.progress(DownloadProgress(bytesDone: held, totalBytes: total, bytesPerSecond: speed, stallTimeout: stall,
                                                   connections: connections)))
            }
            if due.checkpoint {
                checkpointSoon()
                if let pieces = request.pieces { checkPiecesSoon(pieces) }
            }
            if due.writeBehind { writeBehindSoon() }
            return tune() && now - ticks.started < 1
        }
    }

    /// Bytes written between two write-behinds (see ``PartialFile/startWriteback()``).
    static let writeBehindBytes: Int64 = 8 << 20

    /// Queues a write-behind of the partial file on the blocking-I/O pool unless one is queued.
    func writeBehindSoon() {
        guard let file,
            !writeBehindQueued.exchange(true, ordering: .acquiringAndReleasing) else { return }
        BlockingIO.submit {
            // Under `ioLock`, which the run's end closes the file under: never on a closed descriptor.
            self.ioLock.withLock {
                if !self.state.withLockedValue({ $0.ended }) { file.startWriteback() }
            }
            self.writeBehindQueued.store(false, ordering: .releasing)
        }
    }

    /// Queues a check of the pieces completed since the last one (``checkCompletePieces(_:file:)``)
    /// on the blocking-I/O pool unless one is queued or running.
    func checkPiecesSoon(_ pieces: Metalink.Pieces) {
        guard let file,
            !piecesQueued.exchange(true, ordering: .acquiringAndReleasing) else { return }
        BlockingIO.submit {
            self.checkCompletePieces(pieces, file: file)
            self.piecesQueued.store(false, ordering: .releasing)
        }
    }

    /// A tuner sample: now, the process's CPU time and the bytes so far (``RunState`` counts the
    /// connections, those that bring bytes).
    func tunerSample() -> ConnectionTuner.Sample {
        ConnectionTuner.Sample(time: Clock.monotonic(), cpu: options.cpuClock(), bytes: transferred.load(ordering: .relaxed), connections: 0)
    }

    /// Feeds the tuner one sample and carries out what it decides (``RunState/tunerSampled(_:trialBytes:writers:)``,
    /// one look at the state). During the trial one connection runs, and its bytes alone count.
    /// Returns whether the tuner is still deciding.
    func tune() -> Bool {
        let inTrial = trial.load(ordering: .relaxed) >= 0
        let (action, then, tuning) = state.withLockedValue { state -> (ConnectionTuner.Action?, RunState.Tuned?, Bool) in
            guard state.tuning else { return (nil, nil, false) }  // (no sample, no syscall, once decided)
            let (action, then) = state.tunerSampled(tunerSample(), trialBytes: inTrial ? trialBytes.load(ordering: .relaxed) : nil,
                                                    writers: state.writers(now: Clock.monotonic()))
            return (action, then, state.tuning)
        }
        if let action { options.onTune?(action) }
        switch then {
        case .trial(let keeper)?:
            // The others are held where they are (said only if it stands: a trial the tuner
            // takes back is not news).
            trialBytes.store(0, ordering: .relaxed)
            trial.store(keeper, ordering: .relaxed)
        case .restored?:
            bringHeldBack()
        case .keptShed(let kept)?:
            // The held ranges end where they are (their writers see the lowered ends once they
            // read again) and the one connection takes the rest.
            trial.store(-1, ordering: .relaxed)
            if let kept {
                onEvent(.notice("\(kept) connections add no speed here (this machine, not the network, sets the pace); going on with one"))
            }
        case nil:
            break
        }
        return tuning
    }

    /// The tuner's held connections read on (``RunState`` restored them): the trial ends, and any
    /// that finished its range meanwhile and waits at the gate goes on.
    func bringHeldBack() {
        trial.store(-1, ordering: .relaxed)
        restore.open()
    }
}
