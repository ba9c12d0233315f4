#if canImport(Combine)
import Combine

/// A ``DownloadManager``'s downloads as an `ObservableObject` on the main actor, for SwiftUI on
/// iOS 16 (on iOS 17, ``DownloadList``): a row object per download, so that a progress tick
/// redraws that download's row, not the list. ``rows`` changes when downloads come or go; each
/// ``Row/info`` when its download changes. It follows ``DownloadManager/events(backlog:)`` from a
/// snapshot, so it is right from the first frame after any restart, and keeps following until it
/// is released or the manager shuts down.
///
/// ```swift
/// @StateObject var list = DownloadListModel(manager: manager)
/// List(list.rows) { row in DownloadRowView(row: row) }  // @ObservedObject var row: DownloadListModel.Row
/// ```
@MainActor
public final class DownloadListModel: ObservableObject {
    /// One download, as last seen.
    @MainActor
    public final class Row: ObservableObject, Identifiable {
        public nonisolated let id: DownloadID
        @Published public fileprivate(set) var info: DownloadInfo
        init(_ info: DownloadInfo) {
            id = info.id
            self.info = info
        }
    }

    /// A row per download, in the order they were added.
    @Published public private(set) var rows: [Row] = []
    /// Totals over all downloads (nil until the first snapshot).
    @Published public private(set) var totals: ManagerTotals?
    /// Whether the first snapshot has arrived.
    @Published public private(set) var isLoaded = false

    private var state = DownloadListState()
    private var follower: EventFollower?

    /// Follows `manager` from now on.
    public init(manager: DownloadManager) {
        follower = EventFollower(manager, self) { $0.apply($1) }
    }

    /// The download with this id, as last seen.
    public subscript(id: DownloadID) -> DownloadInfo? { state[id] }

    func apply(_ event: ManagerEvent) {
        switch state.apply(event) {
        case .none:
            break
        case .row(let i):
            rows[i].info = state.downloads[i]
        case .totals:
            totals = state.totals
        case .list:
            rows = state.matching(rows, info: \.info, make: Row.init) { $0.info = $1 }
            totals = state.totals
            if !isLoaded, state.isLoaded { isLoaded = true }
        }
    }
}
#endif
