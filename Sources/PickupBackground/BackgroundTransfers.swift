import Foundation
import HTTPTypes
import Pickup
import SystemPackage

#if canImport(FoundationNetworking)
import FoundationNetworking
#endif
#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// Downloads go on while the app is suspended: ``enterBackground()`` suspends the manager and hands
/// what is missing of its waiting downloads to a `URLSession` as download tasks, one per chunk of
/// ``DownloadManager/backgroundChunkSize`` bytes (`Range` plus `If-Range` with the held bytes'
/// strong validator); each chunk that lands is judged like any response and written into its
/// partial file with a durable checkpoint (``DownloadManager/land(_:status:headers:body:ifRange:)``).
/// ``enterForeground()`` cancels what is still going, waits for chunks being written, and starts
/// the manager, whose runs go on from the control files.
///
/// On Apple platforms the session is a background one (`URLSessionConfiguration.background`),
/// run by the system while the app sleeps or after it was ended; make one `BackgroundTransfers`
/// with the same identifier at every launch, before the system delivers the session's events, and
/// pass `application(_:handleEventsForBackgroundURLSession:completionHandler:)`'s handler (or
/// SwiftUI's `.backgroundTask(.urlSession)`) to ``handleEvents(completion:)``. Tasks of an earlier
/// launch name their chunk in their `taskDescription` and land the same way.
/// Elsewhere (Linux) it is a default session of FoundationNetworking in this process: the same
/// chunk path, tested against the test server.
///
/// What goes to the background: see ``DownloadManager/backgroundRequests(chunkSize:)``. Redirects
/// are not followed (the foreground run follows them, refusing a downgrade); cookies are the
/// download's own, none are stored; the session's cache is off; TLS is verified by the system.
public final class BackgroundTransfers: NSObject, @unchecked Sendable {
    /// The manager whose downloads go on in the background.
    public let manager: DownloadManager
    private var session: URLSession!
    private let lock = NSLock()
    // Guarded by `lock`.
    /// The identifiers of the tasks started (or found at launch) and not completed.
    private var tasks: Set<Int> = []
    /// Tasks that completed before the launch's list of the session's tasks came (Apple).
    private var endedEarly: Set<Int> = []
    private var listed = false
    /// Chunks that landed and are being written (how many landings of each: a chunk asked twice,
    /// across launches, may land twice).
    private var beingWritten: [BackgroundChunk: Int] = [:]
    /// The last of the calls to ``enterBackground(chunkSize:)`` and ``enterForeground()``, which
    /// run one after the other.
    private var last: Task<Void, Never>?
    private var idle: [CheckedContinuation<Void, Never>] = []
    private var eventsDone: EventsDone?
    /// The session said its events were delivered before the app passed the system's handler.
    private var eventsFinished = false
    private var landed: [BackgroundChunk: BackgroundLanding] = [:]
    /// Tasks cancelled because their answer outgrew their chunk.
    private var oversized: Set<BackgroundChunk> = []

    /// Chunks fetched at once per host.
    public static let chunksAtOnce = 4

    /// Transfers for `manager`'s downloads in the session named `identifier` (one per app).
    ///
    /// When the system launches the app in the background for the session's events, open the
    /// manager with ``DownloadManager/Configuration/autoStart`` off: chunks land only while it is
    /// suspended (a started manager runs the downloads itself and refuses them).
    public init(manager: DownloadManager, identifier: String = "pickup.background") {
        self.manager = manager
        super.init()
        #if canImport(Darwin)
        let configuration = URLSessionConfiguration.background(withIdentifier: identifier)
        configuration.sessionSendsLaunchEvents = true
        configuration.isDiscretionary = false
        #else
        let configuration = URLSessionConfiguration.default
        #endif
        configuration.httpCookieStorage = nil
        configuration.httpShouldSetCookies = false
        configuration.urlCache = nil
        configuration.requestCachePolicy = .reloadIgnoringLocalCacheData
        // At most this many chunks at a time per host: what a kill of the process (on Linux) or a
        // cancellation can cost, in whole chunks (FoundationNetworking otherwise starts them all).
        configuration.httpMaximumConnectionsPerHost = Self.chunksAtOnce
        let queue = OperationQueue()
        queue.maxConcurrentOperationCount = 1
        session = URLSession(configuration: configuration, delegate: self, delegateQueue: queue)
        #if canImport(Darwin)
        // Tasks of an earlier launch that the system still runs end here too: ``finished()``
        // waits for them.
        session.getAllTasks { found in
            self.settle { me in
                for t in found where t.state != .completed && !me.endedEarly.contains(t.taskIdentifier) {
                    me.tasks.insert(t.taskIdentifier)
                }
                me.listed = true
                me.endedEarly = []
            }
        }
        #else
        listed = true
        #endif
    }

    /// Runs `body` after the calls to enter the background or the foreground made before it.
    private func serially<T: Sendable>(_ body: @escaping @Sendable () async -> T) async -> T {
        let task = lock.withLock { () -> Task<T, Never> in
            let previous = last
            let task = Task { () -> T in
                await previous?.value
                return await body()
            }
            last = Task { _ = await task.value }
            return task
        }
        return await task.value
    }

    /// Suspends the manager (every run checkpoints and ends), then starts a download task for each
    /// chunk missing from the downloads that may go on in the background. A chunk is started only
    /// while the temporary directory, where the session writes its body, has room for it and every
    /// chunk before it (plus 64 MiB): the others wait for the foreground.
    /// - Returns: the chunks started.
    @discardableResult
    public func enterBackground(chunkSize: Int64 = DownloadManager.backgroundChunkSize) async -> [BackgroundChunk] {
        await serially { await self.handOff(chunkSize: chunkSize) }
    }

    private func handOff(chunkSize: Int64) async -> [BackgroundChunk] {
        await manager.suspend()
        // Bytes a task already asks for (an earlier call, or an earlier launch's session, whose
        // chunks may have other bounds), or that landed and are being written, are not asked twice.
        let asking = await withCheckedContinuation { (c: CheckedContinuation<[BackgroundChunk], Never>) in
            session.getAllTasks { tasks in
                c.resume(returning: tasks.filter { $0.state != .completed && $0.state != .canceling }
                    .compactMap { $0.taskDescription.flatMap(BackgroundChunk.init(taskDescription:)) })
            }
        }
        let going = asking + lock.withLock { Array(beingWritten.keys) }
        var room = Self.freeBytes(FileManager.default.temporaryDirectory.path) - (64 << 20)
        var started: [BackgroundChunk] = []
        for r in await manager.backgroundRequests(chunkSize: chunkSize, going: going) {
            let length = r.chunk.end - r.chunk.start
            guard room >= length else { break }
            guard let url = URL(string: r.url) else { continue }
            room -= length
            var request = URLRequest(url: url)
            // (The user's fields first: Range, If-Range and Accept-Encoding are Pickup's.)
            request.httpShouldHandleCookies = false
            for field in r.headers { request.setValue(field.value, forHTTPHeaderField: field.name.rawName) }
            let task = session.downloadTask(with: request)
            task.taskDescription = r.chunk.taskDescription
            #if canImport(Darwin)
            // The system's scheduling hint (a background session runs tasks when it sees fit).
            task.countOfBytesClientExpectsToSend = 1024
            task.countOfBytesClientExpectsToReceive = length + 16 * 1024
            #endif
            lock.withLock { _ = tasks.insert(task.taskIdentifier) }
            task.resume()
            started.append(r.chunk)
        }
        return started
    }

    /// Cancels the tasks still going (their ranges stay missing, for the manager's runs), waits
    /// for the chunks being written, and starts the manager.
    /// - Returns: ``DownloadManager/start()``'s answer.
    @discardableResult
    public func enterForeground() async -> Bool {
        await serially { await self.comeBack() }
    }

    private func comeBack() async -> Bool {
        await withCheckedContinuation { (c: CheckedContinuation<Void, Never>) in
            session.getAllTasks { tasks in
                for task in tasks { task.cancel() }
                c.resume()
            }
        }
        await finished()
        return await manager.start()
    }

    /// Returns once every task has ended and every chunk that landed is written (or refused).
    public func finished() async {
        await withCheckedContinuation { (c: CheckedContinuation<Void, Never>) in
            let now = lock.withLock { () -> Bool in
                if listed && tasks.isEmpty && beingWritten.isEmpty { return true }
                idle.append(c)
                return false
            }
            if now { c.resume() }
        }
    }

    /// What became of each chunk that landed so far (in this process).
    public var landings: [BackgroundChunk: BackgroundLanding] { lock.withLock { landed } }

    /// The system woke or relaunched the app for this session's events: `completion` is called
    /// once they are all delivered and their chunks written.
    /// (UIKit's handler is called on the main queue, as it asks.)
    public func handleEvents(completion: @escaping () -> Void) {
        let handler = EventsDone(call: completion)
        let now = lock.withLock { () -> Bool in
            if eventsFinished {
                // (Those events are these: a later wake waits for its own.)
                eventsFinished = false
                return true
            }
            eventsDone = handler
            return false
        }
        if now { DispatchQueue.main.async { handler.call() } }
    }

    /// The system's handler, kept until the session's events are all delivered.
    struct EventsDone: @unchecked Sendable {
        let call: () -> Void
    }

    /// Ends the session and its tasks without waiting (the app is going away).
    public func invalidate() { session.invalidateAndCancel() }

    /// Applies `change` to the counts and wakes ``finished()``'s waiters once nothing is left.
    private func settle(_ change: (BackgroundTransfers) -> Void) {
        let waiters = lock.withLock { () -> [CheckedContinuation<Void, Never>] in
            change(self)
            guard listed, tasks.isEmpty, beingWritten.isEmpty else { return [] }
            defer { idle = [] }
            return idle
        }
        for w in waiters { w.resume() }
    }

    /// Bytes free to this user in the file system of `path` (0 when it cannot be asked).
    static func freeBytes(_ path: String) -> Int64 {
        var s = statvfs()
        guard statvfs(path, &s) == 0 else { return 0 }
        let (free, size) = (Int64(clamping: UInt64(s.f_bavail)), Int64(clamping: UInt64(s.f_frsize)))
        return free.multipliedReportingOverflow(by: size).overflow ? .max : free * size
    }
}

extension BackgroundTransfers: URLSessionDownloadDelegate {
    public func urlSession(_ session: URLSession, downloadTask: URLSessionDownloadTask, didFinishDownloadingTo location: URL) {
        guard let chunk = downloadTask.taskDescription.flatMap(BackgroundChunk.init(taskDescription:)),
            let response = downloadTask.response as? HTTPURLResponse
        else { return }
        // The session removes `location` when this returns: the file is opened first (here, on
        // the delegate's queue, not on Swift's pool), and the descriptor keeps its bytes until
        // they are written; nothing is left behind when the process dies.
        let fd = open(location.path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW)
        guard fd >= 0 else { return }
        // (FoundationNetworking leaves its files behind: the name goes now, the bytes with the
        // descriptor.)
        unlink(location.path)
        let body = FileDescriptor(rawValue: fd)
        let headers = response.allHeaderFields.compactMap { (k, v) -> (name: String, value: String)? in
            guard let k = k as? String, let v = v as? String else { return nil }
            return (k, v)
        }
        let status = response.statusCode
        let ifRange = downloadTask.originalRequest?.value(forHTTPHeaderField: "If-Range")
        // A background session follows redirects by itself (the delegate is not asked): an answer
        // from anywhere but the URL asked is never written.
        let moved = response.url.map { $0 != downloadTask.originalRequest?.url } ?? true
        lock.withLock { beingWritten[chunk, default: 0] += 1 }
        let manager = manager
        Task {
            let landing = moved ? .refused("redirected: the foreground run follows redirects")
                : await manager.land(chunk, status: status, headers: headers, body: body, ifRange: ifRange)
            try? body.close()
            self.settle { me in
                me.landed[chunk] = landing
                let left = (me.beingWritten[chunk] ?? 1) - 1
                me.beingWritten[chunk] = left > 0 ? left : nil
            }
        }
    }

    /// An answer longer than its chunk (a 200 with the whole file: it changed, or the server
    /// ignores ranges; or a hostile one) is cut off as soon as it passes the chunk's length: it
    /// would be refused anyway, and the temporary directory is not the place for a whole file.
    public func urlSession(_ session: URLSession, downloadTask: URLSessionDownloadTask, didWriteData bytesWritten: Int64,
                           totalBytesWritten: Int64, totalBytesExpectedToWrite: Int64) {
        guard let chunk = downloadTask.taskDescription.flatMap(BackgroundChunk.init(taskDescription:)),
            totalBytesWritten > chunk.end - chunk.start
        else { return }
        lock.withLock { _ = oversized.insert(chunk) }
        downloadTask.cancel()
    }

    public func urlSession(_ session: URLSession, task: URLSessionTask, didCompleteWithError error: Error?) {
        let chunk = task.taskDescription.flatMap(BackgroundChunk.init(taskDescription:))
        let id = task.taskIdentifier
        settle { me in
            if let chunk, me.oversized.remove(chunk) != nil {
                me.landed[chunk] = .refused("the answer is longer than the range asked for (the file changed, or the server ignores ranges)")
            }
            if me.tasks.remove(id) == nil, !me.listed { me.endedEarly.insert(id) }
        }
    }

    public func urlSession(_ session: URLSession, task: URLSessionTask, willPerformHTTPRedirection response: HTTPURLResponse,
                           newRequest request: URLRequest, completionHandler: @escaping @Sendable (URLRequest?) -> Void) {
        completionHandler(nil)
    }

    #if canImport(Darwin)
    public func urlSessionDidFinishEvents(forBackgroundURLSession session: URLSession) {
        Task {
            await self.finished()
            let done = self.lock.withLock { () -> EventsDone? in
                defer { self.eventsDone = nil }
                self.eventsFinished = self.eventsDone == nil
                return self.eventsDone
            }
            if let done { DispatchQueue.main.async { done.call() } }
        }
    }
    #endif
}
