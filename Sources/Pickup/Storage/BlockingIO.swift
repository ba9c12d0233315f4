import NIOCore
import NIOPosix

/// The threads where blocking file-system calls run (fsync, rename, link, unlink, opening new
/// files, reading a control file, hashing a finished file): never Swift's cooperative pool, whose
/// few threads every task and the engine's own work share, and never under the engine's lock.
///
/// Sixteen threads, so that the fsyncs of files that finish close together are in flight at once
/// and the file system's journal commits them together, instead of one after another behind two
/// cooperative threads.
package enum BlockingIO {
    static let threads = 16

    static let pool: NIOThreadPool = {
        let pool = NIOThreadPool(numberOfThreads: threads)
        pool.start()
        return pool
    }()

    /// Runs `body` on the pool and returns its result (or its error) to the awaiting task. Not
    /// cancelled with the task (NIO's `runIfActive` is): the last checkpoint of a cancelled
    /// download runs here, and a started rename or fsync is never abandoned halfway.
    package static func run<T: Sendable>(_ body: @escaping @Sendable () throws -> T) async throws -> T {
        try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<T, Error>) in
            pool.submit { state in
                guard state == .active else { return continuation.resume(throwing: CancellationError()) }
                continuation.resume(with: Result(catching: body))
            }
        }
    }

    /// Runs `body` on the pool; its result (or error) completes the future on `loop`. For work an
    /// event loop must not do itself (a response head's file-system work).
    static func future<T: Sendable>(on loop: any EventLoop, _ body: @escaping @Sendable () throws -> T) -> EventLoopFuture<T> {
        pool.runIfActive(eventLoop: loop, body)
    }

    /// Runs `body` on the pool, not waiting for it.
    static func submit(_ body: @escaping @Sendable () -> Void) {
        pool.submit { state in
            if state == .active { body() }
        }
    }
}
