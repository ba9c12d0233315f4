/// The decisions about a download's control file, as a value-type state machine: what the record
/// says, what the file on disk claims, when it must be written and whether durably. It does no
/// I/O: ``FileDownload`` keeps it under its lock and carries out the ``Action``s it returns
/// outside that lock, on the blocking-I/O pool, one at a time, then reports them done with
/// ``stored(_:version:)``.
///
/// The rules it keeps:
/// - The control file never claims a byte that is not durable: a range's `done` rises only
///   through a checkpoint, whose caller fsyncs the data before storing the record, or a
///   recovery, the same.
/// - A control file that claims no bytes needs no fsync: whatever happens to it, the next run
///   holds nothing it could mispair. Such a file is written without waiting, while data flows.
/// - A file claiming bytes is replaced durably before a byte of another representation is
///   written (``restarted()``).
/// - Files up to ``smallFile`` get no control file until the first checkpoint: most end before
///   it and never write one.
struct Checkpoints: Equatable {
    /// What a download of up to this many bytes does not write a control file for at its start.
    static let smallFile: Int64 = 1 << 20

    /// The download as the control file describes it. Each range's `done` counts durable bytes only.
    private(set) var record: ControlRecord
    /// What the control file on disk claims.
    private(set) var onDisk = OnDisk.nothing
    /// Bumped by every change of the record's description; a store reports the version it wrote.
    private(set) var version = 0
    /// The version on disk (-1: none, after the file was removed).
    private var storedVersion = 0
    /// The run is over (finished, failed or stopped): a checkpoint or store queued before its end
    /// and run after it writes nothing (it would leave a control file beside a finished file).
    private(set) var ended = false

    enum OnDisk: Equatable {
        /// No control file (none yet, or removed).
        case nothing
        /// One that holds no byte: written without fsync.
        case claimsNothing
        /// One that claims durable bytes.
        case claimsBytes
    }

    enum Action: Equatable {
        case none
        /// Write `record` as the control file; `durable`: fsync it and its directory.
        case store(ControlRecord, version: Int, durable: Bool)
        /// fsync the partial file, then store `record` (whose ranges claim the bytes written
        /// before the fsync) durably.
        case syncAndStore(ControlRecord, version: Int)
    }

    init(record: ControlRecord) { self.record = record }

    /// A control file was read from disk: it is the record, as it is stored.
    mutating func loaded(_ record: ControlRecord) {
        self.record = record
        onDisk = record.durableBytes > 0 ? .claimsBytes : .claimsNothing
        version += 1
        storedVersion = version
        if record.epoch == nil { update { $0.epoch = ControlRecord.newEpoch() } }
    }

    /// The control file was removed.
    mutating func removed() {
        onDisk = .nothing
        storedVersion = -1
    }

    /// Changes the record's description (validators, length, target, the ranges' shape). A
    /// range's `done` may be lowered here (a range cut short), never raised.
    mutating func update(_ change: (inout ControlRecord) -> Void) {
        let before = record.segments.map(\.done)
        change(&record)
        for i in record.segments.indices where i < before.count {
            record.segments[i].done = min(record.segments[i].done, before[i])
        }
        version += 1
    }

    /// Whether the description changed since it was stored and should be written now rather than
    /// at the next checkpoint: a control file exists (it must not describe another file), or the
    /// file is not small.
    var wantsStoreSoon: Bool {
        version != storedVersion && (onDisk != .nothing || (record.totalLength ?? .max) > Self.smallFile)
    }

    /// The record as it is now, to be written without fsync; nothing when it is stored already.
    func storeNow() -> Action {
        version == storedVersion || ended ? .none : .store(record, version: version, durable: false)
    }

    /// The run is over: nothing is written from now on.
    mutating func end() { ended = true }

    /// Every held byte is being discarded (`reset` makes the new, empty description): a new epoch.
    /// Returns the store to carry out before a byte of the new representation is written and
    /// before the cursor file takes the new epoch: durable when the file on disk claims bytes (it
    /// would pair them with the new ones), else without fsync (a file that claims nothing keeps
    /// the old epoch and validators otherwise, and a kill then would find the cursors of the new
    /// bytes under another epoch, and lose them); nothing when there is no control file.
    mutating func restarted(_ reset: (inout ControlRecord) -> Void) -> Action {
        reset(&record)
        for i in record.segments.indices { record.segments[i].done = 0 }
        record.epoch = ControlRecord.newEpoch()
        version += 1
        return onDisk == .nothing ? .none : .store(record, version: version, durable: onDisk == .claimsBytes)
    }

    /// A periodic checkpoint, given how many bytes of each range (by index, from its start) are
    /// written: the record claiming them, for the caller to fsync the data and store; nothing
    /// when nothing was written and the description is stored.
    func checkpoint(written: [Int: Int64]) -> Action {
        var next = record
        var more = false
        for (i, w) in written where next.segments.indices.contains(i) {
            let s = next.segments[i]
            let bytes = min(w, s.end.map { $0 - s.start } ?? .max)
            if bytes > s.done {
                next.segments[i].done = bytes
                more = true
            }
        }
        return (more || version != storedVersion) && !ended ? .syncAndStore(next, version: version) : .none
    }

    /// Takes back ranges found written after a process was killed (``Recovery``, from the
    /// ``CursorFile`` of the same boot): the record with `merged` ranges, for the caller to fsync
    /// the data and store before anything else; nothing when they add no byte.
    func recovered(_ merged: [SegmentRecord]) -> Action {
        guard merged != record.segments else { return .none }
        var next = record
        next.segments = merged
        return .syncAndStore(next, version: version)
    }

    /// The held bytes are now `segments` (bytes that failed a hash no longer held; never more than
    /// was claimed): the record takes them at once, whatever their shape, and returns the durable
    /// store to carry out before a byte is written into what they no longer hold.
    mutating func reshaped(_ segments: [SegmentRecord]) -> Action {
        record.segments = segments
        version += 1
        return ended ? .none : .store(record, version: version, durable: true)
    }

    /// Every byte is written and the caller has fsynced the file: the record claiming all of it,
    /// to store durably when a digest is still to be verified and a control file exists (a kill
    /// during the verification then costs a verification, not the bytes). Without a digest the
    /// file is renamed next: nothing to store. A download that ends before its first checkpoint
    /// never writes a control file.
    mutating func finishing(size: Int64, verifying: Bool) -> Action {
        update { $0.totalLength = size }
        var next = record
        next.segments = [SegmentRecord(start: 0, end: size, done: size)]
        return onDisk == .nothing || !verifying ? .none : .store(next, version: version, durable: true)
    }

    /// `stored` (of `version`) is on disk: its claims are durable now.
    mutating func stored(_ stored: ControlRecord, version v: Int) {
        guard stored.epoch == record.epoch else { return }
        let sameShape = stored.segments.count == record.segments.count
            && zip(stored.segments, record.segments).allSatisfy { $0.start == $1.start && $0.end == $1.end }
        if !sameShape && v == version {
            // A recovery or the finish: the stored ranges are the record's from now on.
            record.segments = stored.segments
        } else {
            // A checkpoint taken before the ranges were split further: raise what it claimed.
            for i in record.segments.indices where i < stored.segments.count && stored.segments[i].start == record.segments[i].start {
                let cap = record.segments[i].end.map { $0 - record.segments[i].start } ?? .max
                record.segments[i].done = max(record.segments[i].done, min(stored.segments[i].done, cap))
            }
        }
        if v == version { storedVersion = v }
        onDisk = stored.durableBytes > 0 ? .claimsBytes : .claimsNothing
    }
}
