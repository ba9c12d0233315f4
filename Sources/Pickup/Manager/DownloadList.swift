#if canImport(Observation)
import NIOConcurrencyHelpers
import Observation

/// A ``DownloadManager``'s downloads as an `@Observable` value on the main actor, for a UI to bind
/// to (SwiftUI redraws what reads it when it changes): every download in the order they were added,
/// with its state and progress, and the totals. It follows ``DownloadManager/events(backlog:)`` from
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
    public private(set) var downloads: [DownloadInfo] = []
    /// Totals over all downloads (nil until the first snapshot).
    public private(set) var totals: ManagerTotals?
    /// Whether the first snapshot has arrived.
    public private(set) var isLoaded = false

    @ObservationIgnored private var index: [DownloadID: Int] = [:]
    @ObservationIgnored private let following = NIOLockedValueBox<Task<Void, Never>?>(nil)

    /// Follows `manager` from now on.
    public init(manager: DownloadManager) {
        let task = Task { @MainActor [weak self] in
            for await event in await manager.events() {
                guard let self else { return }
                self.apply(event)
            }
        }
        following.withLockedValue { $0 = task }
    }

    deinit {
        following.withLockedValue { $0?.cancel() }
    }

    /// The download with this id, as last seen.
    public subscript(id: DownloadID) -> DownloadInfo? {
        index[id].map { downloads[$0] }
    }

    func apply(_ event: ManagerEvent) {
        switch event {
        case .snapshot(let all, let t):
            downloads = all.sorted { $0.id < $1.id }
            reindex()
            totals = t
            isLoaded = true
        case .added(let info):
            if let i = index[info.id] {
                downloads[i] = info
            } else {
                index[info.id] = downloads.count
                downloads.append(info)
            }
        case .changed(let info):
            if let i = index[info.id] { downloads[i] = info }
        case .progress(let id, let p):
            if let i = index[id] { downloads[i].progress = p }
        case .totals(let t):
            totals = t
        case .removed(let id):
            if let i = index[id] {
                downloads.remove(at: i)
                reindex()
            }
        case .notice:
            break
        }
    }

    private func reindex() {
        index = Dictionary(uniqueKeysWithValues: downloads.enumerated().map { ($1.id, $0) })
    }
}
#endif
