import Foundation

/// The control file's writes and the partial file's fsyncs, carried out for ``Checkpoints`` on the
/// blocking-I/O pool (``BlockingIO``), outside the state's lock, one at a time under `ioLock`. The data path
/// never waits for them.
extension FileDownload {
    /// Carries out `action`. With `ioLock` held, not the state's lock.
    func perform(_ action: Checkpoints.Action, file: PartialFile?) throws(PickupError) {
        switch action {
        case .none:
            return
        // A checkpoint needs its data on disk before the record that claims it, not the drive's
        // cache flushed: barrier fsyncs on Apple platforms (the finish flushes in full).
        case .store(let record, let version, let durable):
            try ControlFile.store(record, as: controlName, in: dir, durable: durable, barrier: true)
            state.withLockedValue { $0.stored(record, version: version) }
        case .syncAndStore(let record, let version):
            if let failed = state.withLockedValue({ $0.syncFailure }) { throw failed }
            do {
                try file?.sync(barrier: true)
            } catch {
                state.withLockedValue { $0.syncFailed(error) }
                throw error
            }
            try ControlFile.store(record, as: controlName, in: dir, durable: true, barrier: true)
            state.withLockedValue { $0.stored(record, version: version) }
        }
    }

    /// Makes the bytes written so far durable and records them: data first, control file second.
    /// Waits for a checkpoint in flight. On the blocking-I/O pool.
    func checkpointNow() throws {
        try ioLock.withLock {
            // (A foreign partial file: nothing of ours here yet.)
            try perform(state.withLockedValue { $0.foreign == nil ? $0.checkpoint() : .none }, file: file)
        }
    }

    /// Ends the run's file I/O: after any checkpoint or store in flight, nothing more is written
    /// (see ``Checkpoints/ended``) and the partial file is closed. On the blocking-I/O pool.
    func end(_ file: PartialFile) {
        ioLock.withLock {
            state.withLockedValue { $0.end() }
            file.close()
        }
    }

    /// Queues a checkpoint on the blocking-I/O pool unless one is queued or running already.
    func checkpointSoon() {
        guard !checkpointQueued.exchange(true, ordering: .acquiringAndReleasing) else { return }
        BlockingIO.submit {
            try? self.checkpointNow()
            self.checkpointQueued.store(false, ordering: .releasing)
        }
    }

    /// Writes the record as it is then, without fsync (it claims nothing new), on the pool.
    func storeSoon() {
        BlockingIO.submit { self.storeRecord() }
    }

    /// The description a head brought: written before the body when no control file exists yet
    /// (without fsync: it claims nothing), so that a kill from the first byte on finds it and the
    /// cursors; else (a description that changed, of a download with a control file) on the pool.
    /// On the response head's `BlockingIO` thread, not under the state's lock.
    func storeBeforeFirstByte() {
        guard state.withLockedValue({ $0.onDisk == .nothing }) else { return storeSoon() }
        storeRecord()
    }

    /// Writes the record as it is now, without fsync, after any checkpoint in flight.
    func storeRecord() {
        ioLock.withLock { try? perform(state.withLockedValue { $0.storeNow() }, file: nil) }
    }

    /// Drops every held byte for a new representation (`reset` describes it) and, when the
    /// control file on disk claims bytes, replaces it durably before returning: no byte of the new
    /// representation is written before. The cursors start again. Called where no connection is
    /// writing, on `BlockingIO` (the pool, or a response head's thread), never under the state's lock.
    func discardHeld(_ file: PartialFile, reset: (inout ControlRecord) -> Void) throws {
        try ioLock.withLock {
            try file.truncate(to: 0)
            let (action, mapped, epoch) = state.withLockedValue { ($0.restarted(reset), $0.cursorFile, $0.record.epoch ?? 0) }
            try perform(action, file: nil)
            mapped?.reset(epoch: epoch)
        }
    }

    /// Starts over from zero after the representation changed (or cannot be resumed).
    func restartFromZero(_ file: PartialFile) async throws {
        try await BlockingIO.run {
            try self.discardHeld(file) { _ in }  // (nothing known of the file: ``ControlRecord/holdingNothing(rejections:)``)
        }
    }

    /// Maps the cursor file when a download turns out large enough to keep one (see
    /// ``Checkpoints/smallFile``); resumed downloads map it when they start. On the response
    /// head's `BlockingIO` thread, before its body is written, not under the state's lock.
    /// `orRecorded`: an unknown `total` is the record's length (a range of the file described).
    func mapCursorsIfLarge(total: Int64?, orRecorded: Bool = false) {
        guard options.cursorFile,
            state.withLockedValue({ (total ?? (orRecorded ? $0.record.totalLength : nil) ?? .max) > Checkpoints.smallFile && $0.cursorFile == nil }),
            let mapped = CursorFile.open(cursorName, in: dir)
        else { return }
        // The epoch once the file is open (a discard meanwhile made a new one), the slots reset to
        // it before any cursor is kept there.
        mapped.reset(epoch: state.withLockedValue { $0.record.epoch ?? 0 })
        state.withLockedValue { $0.mapped(mapped) }
    }
}
