/// What a run's monitor ticks decide, as a value (no I/O): when progress is reported and at what
/// speed, when a checkpoint and a write-behind are due. ``FileDownload/tick(now:)`` feeds it the
/// time and the bytes written, and carries out what is due.
struct Ticks {
    /// Between ``FileDownload/startMonitoring()`` and ``FileDownload/stopMonitoring()``.
    var monitored = false
    private var meter = SpeedMeter()
    private(set) var started = 0.0
    private var lastProgress = 0.0
    private var lastCheckpoint = 0.0
    /// Bytes written at the last write-behind.
    private var writtenBehind: Int64 = 0

    /// Reports every `progressEvery` seconds (give or take a tenth: ticks are shared by all
    /// downloads), checkpoints every `checkpointEvery` (at the first tick after it), a
    /// write-behind every `writeBehindEvery` bytes written.
    let progressEvery: Double
    let checkpointEvery: Double
    let writeBehindEvery: Int64

    /// What one tick finds due.
    struct Due: Equatable {
        /// A progress report, at this speed (bytes per second over the meter's window).
        var progress: Double?
        var checkpoint = false
        var writeBehind = false
    }

    init(progressEvery: Double, checkpointEvery: Double, writeBehindEvery: Int64) {
        self.progressEvery = progressEvery
        self.checkpointEvery = checkpointEvery
        self.writeBehindEvery = writeBehindEvery
    }

    /// Monitoring starts at `now`.
    mutating func start(now: Double) {
        self = Ticks(progressEvery: progressEvery, checkpointEvery: checkpointEvery, writeBehindEvery: writeBehindEvery)
        monitored = true
        (started, lastProgress, lastCheckpoint) = (now, now, now)
    }

    /// A tick at `now`, `written` bytes written in the run so far: what is due (nothing once
    /// monitoring stopped).
    mutating func tick(now: Double, written: Int64) -> Due {
        var due = Due()
        guard monitored else { return due }
        if now - lastProgress >= progressEvery * 0.9 {
            lastProgress = now
            due.progress = meter.add(time: now, bytes: written)
        }
        if now - lastCheckpoint >= checkpointEvery {
            lastCheckpoint = now
            due.checkpoint = true
        }
        if written - writtenBehind >= writeBehindEvery {
            writtenBehind = written
            due.writeBehind = true
        }
        return due
    }
}
