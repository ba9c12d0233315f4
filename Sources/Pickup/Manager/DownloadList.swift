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
/// List(list.downloads, id: \.id) { d in
///     ProgressView(value: d.progress.fraction ?? 0) { Text(d.path?.lastComponent?.string ?? d.url) }
/// }
/// ```
@available(macOS 14, iOS 17, tvOS 17, watchOS 10, *)
@MainActor @Observable
public final class DownloadList {
    /// Every download, in the order they were added.
    public var downloads: [DownloadInfo] { state.downloads }
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
        state.apply(event)
    }
}
#endif
