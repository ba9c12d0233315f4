/// Applies a manager's events (``DownloadManager/events(backlog:)``, from its snapshot on) to a
/// main-actor model for as long as the model lives: the list models' link to their manager. The
/// model is held weakly; releasing it (and so this) ends the following.
final class EventFollower: Sendable {
    private let task: Task<Void, Never>

    @MainActor
    init<Model: AnyObject & Sendable>(_ manager: DownloadManager, _ model: Model,
                                      apply: @escaping @MainActor (Model, ManagerEvent) -> Void) {
        task = Task { @MainActor [weak model] in
            for await event in await manager.events() {
                guard let model else { return }
                apply(model, event)
            }
        }
    }

    deinit { task.cancel() }
}
