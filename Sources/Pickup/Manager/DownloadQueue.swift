/// The queue as a value: every download's state, priority and place, which transitions are
/// allowed, and which waiting downloads start next. No I/O and no clock, so every rule is tested
/// without sockets; ``DownloadManager`` feeds it and carries out what it decides.
///
/// Waiting downloads are kept sorted (priority first, then FIFO or LIFO by place), so choosing
/// the next one is O(1) and adding or removing one is a binary search.
public struct DownloadQueue: Sendable {
    /// What the queue knows of one download.
    public struct Entry: Sendable, Equatable {
        public var state: DownloadState
        public var priority: Int
        /// Place in order of adding (moving to the front gives a place before every other).
        public var place: Int64
    }

    public private(set) var entries: [DownloadID: Entry] = [:]
    /// Waiting downloads, the next to start first.
    public private(set) var waiting: [DownloadID] = []
    /// FIFO or LIFO among equal priorities.
    public private(set) var order: QueueOrder
    private var lowestPlace: Int64 = 0
    private var highestPlace: Int64 = 0

    /// An empty queue.
    public init(order: QueueOrder = .fifo) { self.order = order }

    /// Number of downloads in `state`.
    public func count(_ state: DownloadState) -> Int {
        state == .waiting ? waiting.count : entries.values.lazy.filter { $0.state == state }.count
    }

    // MARK: - Adding and removing

    /// Adds a download at the back (the place after every other), or at `place` when restoring.
    /// Returns its place.
    @discardableResult
    public mutating func add(_ id: DownloadID, state: DownloadState, priority: Int, place: Int64? = nil) -> Int64 {
        remove(id)
        let p = place ?? (entries.isEmpty ? 0 : highestPlace + 1)
        if entries.isEmpty {
            lowestPlace = p
            highestPlace = p
        }
        lowestPlace = min(lowestPlace, p)
        highestPlace = max(highestPlace, p)
        entries[id] = Entry(state: state, priority: priority, place: p)
        if state == .waiting { insertWaiting(id) }
        return p
    }

    /// Forgets a download.
    public mutating func remove(_ id: DownloadID) {
        guard let e = entries[id] else { return }
        if e.state == .waiting { removeWaiting(id) }
        entries[id] = nil
    }

    // MARK: - Transitions

    /// Whether a download may go from one state to another.
    public static func allows(_ from: DownloadState, _ to: DownloadState) -> Bool {
        switch (from, to) {
        case (.waiting, .running), (.waiting, .paused): true
        case (.running, .completed), (.running, .failed), (.running, .paused), (.running, .waiting): true
        case (.paused, .waiting), (.failed, .waiting), (.completed, .waiting): true
        default: false
        }
    }

    /// Moves a download to `state` if that transition is allowed; returns whether it moved.
    @discardableResult
    public mutating func transition(_ id: DownloadID, to state: DownloadState) -> Bool {
        guard let e = entries[id], Self.allows(e.state, state) else { return false }
        force(id, to: state)
        return true
    }

    /// Puts a download in `state` whatever it was in (a transfer that ended otherwise than asked:
    /// it completed while being paused, say).
    public mutating func force(_ id: DownloadID, to state: DownloadState) {
        guard let e = entries[id], e.state != state else { return }
        if e.state == .waiting { removeWaiting(id) }
        entries[id]!.state = state
        if state == .waiting { insertWaiting(id) }
    }

    /// The place the next added download gets.
    public var nextPlace: Int64 { entries.isEmpty ? 0 : highestPlace + 1 }

    /// The waiting downloads to start now, given how many transfers are going on and the limit
    /// (nil: start them all, the batch mode), skipping those in `busy` (an earlier transfer of
    /// theirs is still ending). They are marked running.
    public mutating func startNext(active: Int, limit: Int?, busy: Set<DownloadID> = []) -> [DownloadID] {
        var free = limit.map { max(0, $0 - active) } ?? waiting.count
        var chosen: [DownloadID] = []
        for id in waiting where free > 0 && !busy.contains(id) {
            chosen.append(id)
            free -= 1
        }
        for id in chosen { transition(id, to: .running) }
        return chosen
    }

    /// The running downloads to send back to waiting so that at most `limit` run: those that
    /// would start last, so that what is running stays what the order prefers.
    public func overLimit(running: [DownloadID], limit: Int) -> [DownloadID] {
        guard running.count > limit else { return [] }
        let sorted = running.sorted { precedes($0, $1) }
        return Array(sorted.suffix(running.count - limit))
    }

    // MARK: - Order

    /// Changes the priority of a download.
    public mutating func setPriority(_ id: DownloadID, _ priority: Int) {
        guard let e = entries[id] else { return }
        if e.state == .waiting { removeWaiting(id) }
        entries[id]!.priority = priority
        if e.state == .waiting { insertWaiting(id) }
    }

    /// Makes a download the next to start: the highest priority of any waiting download and a
    /// place before every other. Returns its new priority and place.
    @discardableResult
    public mutating func moveToFront(_ id: DownloadID) -> (priority: Int, place: Int64)? {
        guard let e = entries[id] else { return nil }
        if e.state == .waiting { removeWaiting(id) }
        let top = waiting.first.flatMap { entries[$0]?.priority } ?? e.priority
        let priority = max(e.priority, top)
        let place: Int64
        switch order {
        case .fifo:
            lowestPlace -= 1
            place = lowestPlace
        case .lifo:
            highestPlace += 1
            place = highestPlace
        }
        entries[id] = Entry(state: e.state, priority: priority, place: place)
        if e.state == .waiting { insertWaiting(id) }
        return (priority, place)
    }

    /// Changes FIFO/LIFO; the waiting list is sorted again.
    public mutating func setOrder(_ order: QueueOrder) {
        self.order = order
        let sorted = waiting.sorted { precedes($0, $1) }
        waiting = sorted
    }

    /// Whether `a` starts before `b`: higher priority, then earlier (FIFO) or later (LIFO) place.
    func precedes(_ a: DownloadID, _ b: DownloadID) -> Bool {
        let x = entries[a]!, y = entries[b]!
        if x.priority != y.priority { return x.priority > y.priority }
        if x.place != y.place { return order == .fifo ? x.place < y.place : x.place > y.place }
        return a < b
    }

    private func insertionIndex(_ id: DownloadID) -> Int {
        var lo = 0, hi = waiting.count
        while lo < hi {
            let mid = (lo + hi) / 2
            if precedes(waiting[mid], id) { lo = mid + 1 } else { hi = mid }
        }
        return lo
    }

    private mutating func insertWaiting(_ id: DownloadID) {
        waiting.insert(id, at: insertionIndex(id))
    }

    private mutating func removeWaiting(_ id: DownloadID) {
        let i = insertionIndex(id)
        if i < waiting.count, waiting[i] == id {
            waiting.remove(at: i)
        } else if let j = waiting.firstIndex(of: id) {
            waiting.remove(at: j)
        }
    }
}
