/// What a list of a ``DownloadManager``'s downloads shows, folded from its events
/// (``DownloadManager/events(backlog:)``): every download in the order they were added, with its
/// state and progress, and the totals. A value, with no actor and no observation: the UI models
/// (``DownloadList`` on iOS 17, ``DownloadListModel`` on iOS 16) each keep one and publish what
/// ``apply(_:)`` says changed, so that a progress tick redraws one row, not the list.
public struct DownloadListState: Sendable {
    /// Every download, in the order they were added.
    public private(set) var downloads: [DownloadInfo] = []
    /// Totals over all downloads (nil until the first snapshot).
    public private(set) var totals: ManagerTotals?
    /// Whether the first snapshot has arrived.
    public private(set) var isLoaded = false
    private var index: [DownloadID: Int] = [:]

    /// What an event changed.
    public enum Change: Sendable, Equatable {
        /// Nothing shown.
        case none
        /// The list itself: downloads came or went (or a snapshot replaced them).
        case list
        /// One download, at this position of ``downloads``.
        case row(Int)
        /// The totals alone.
        case totals
    }

    public init() {}

    /// The download with this id, as last seen.
    public subscript(id: DownloadID) -> DownloadInfo? {
        index[id].map { downloads[$0] }
    }

    /// Folds `event` in; returns what it changed.
    @discardableResult
    public mutating func apply(_ event: ManagerEvent) -> Change {
        switch event {
        case .snapshot(let all, let t):
            downloads = all.sorted { $0.id < $1.id }
            reindex()
            totals = t
            isLoaded = true
            return .list
        case .added(let info):
            if let i = index[info.id] {
                downloads[i] = info
                return .row(i)
            }
            index[info.id] = downloads.count
            downloads.append(info)
            return .list
        case .changed(let info):
            guard let i = index[info.id] else { return .none }
            downloads[i] = info
            return .row(i)
        case .progress(let id, let p):
            guard let i = index[id] else { return .none }
            downloads[i].progress = p
            return .row(i)
        case .totals(let t):
            totals = t
            return .totals
        case .removed(let id):
            guard let i = index[id] else { return .none }
            downloads.remove(at: i)
            reindex()
            return .list
        case .notice:
            return .none
        }
    }

    /// `rows` (a UI's objects, one per download) made to match ``downloads`` after a ``Change/list``:
    /// the row of a download still listed is kept (a view holding it goes on updating) and given
    /// its download by `update` when that changed; a new download gets `make`'s.
    public func matching<Row: AnyObject>(_ rows: [Row], info: (Row) -> DownloadInfo, make: (DownloadInfo) -> Row,
                                         update: (Row, DownloadInfo) -> Void) -> [Row] {
        let kept = Dictionary(rows.map { (info($0).id, $0) }, uniquingKeysWith: { first, _ in first })
        return downloads.map { d in
            guard let row = kept[d.id] else { return make(d) }
            if info(row) != d { update(row, d) }
            return row
        }
    }

    private mutating func reindex() {
        index = Dictionary(uniqueKeysWithValues: downloads.enumerated().map { ($1.id, $0) })
    }
}
