#if canImport(Observation)
import Observation

/// A ``DownloadManager``'s downloads as an `@Observable` value on the main actor, for a UI to bind
/// to (SwiftUI redraws what reads it when it changes): every download in the order they were added,
/// with its state and progress, and the totals (``DownloadListState``; on iOS 16,
/// ``DownloadListModel``). It follows ``DownloadManager/events(backlog:)`` from
/// a snapshot, so it is right from the first frame after any restart, and keeps following until it
/// is released or the manager shuts down.
///
/// ```swift
/// @State var list = DownloadList(manager: manager)
/// List(list.rows) { row in RowView(row: row) }  // a view per row: a tick redraws that one
///
/// struct RowView: View {
///     let row: DownloadList.Row
///     var body: some View {
///         ProgressView(value: row.info.progress.fraction ?? 0) { Text(row.info.path?.lastComponent?.string ?? row.info.url) }
///     }
/// }
/// ```
@available(macOS 14, iOS 17, tvOS 17, watchOS 10, *)
@MainActor @Observable
public final class DownloadList {
    /// One download, as last seen: an `@Observable` object of its own, so that a view that reads
    /// a row (not ``downloads``) is redrawn when that download changes, not at every tick of another.
    @MainActor @Observable
    public final class Row: Identifiable {
        public nonisolated let id: DownloadID
        public fileprivate(set) var info: DownloadInfo
        init(_ info: DownloadInfo) {
            id = info.id
            self.info = info
        }
    }

    /// Every download, in the order they were added. Reading it observes every change, progress
    /// included; a list of many downloads reads ``rows``.
    public var downloads: [DownloadInfo] { state.downloads }
    /// A row per download, in the order they were added: changed when downloads come or go; each
    /// ``Row/info`` when its download changes.
    public private(set) var rows: [Row] = []
    /// Totals over all downloads (nil until the first snapshot).
    public var totals: ManagerTotals? { state.totals }
    /// Whether the first snapshot has arrived.
    public var isLoaded: Bool { state.isLoaded }

    private var state = DownloadListState()
    @ObservationIgnored private var follower: EventFollower?

    /// Follows `manager` from now on.
    public init(manager: DownloadManager) {
        follower = EventFollower(manager, self) { $0.apply($1) }
    }

    /// The download with this id, as last seen.
    public subscript(id: DownloadID) -> DownloadInfo? { state[id] }

    func apply(_ event: ManagerEvent) {
        // (A notice shows nothing: not a change for what reads the list.)
        if case .notice = event { return }
        // Nor does an event for a download not listed (one removed meanwhile): `state` is left
        // alone, so what reads it is not redrawn for nothing.
        switch event {
        case .changed(let info) where state[info.id] == nil: return
        case .progress(let id, _) where state[id] == nil, .removed(let id) where state[id] == nil: return
        default: break
        }
        // (`state` itself is observed by what reads `downloads`, `totals` and `isLoaded`.)
        switch state.apply(event) {
        case .none, .totals:
            break
        case .row(let i):
            rows[i].info = state.downloads[i]
        case .list:
            rows = state.matching(rows, info: \.info, make: Row.init) { $0.info = $1 }
        }
    }
}
#endif
