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
        try await run(on: pool, body)
    }

    private static func run<T: Sendable>(on pool: NIOThreadPool, _ body: @escaping @Sendable () throws -> T) async throws -> T {
        try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<T, Error>) in
            pool.submit { state in
                guard state == .active else { return continuation.resume(throwing: CancellationError()) }
                continuation.resume(with: Result(catching: body))
            }
        }
    }

    /// The threads where response heads are decided (``ResponseSink/receiveHead(_:)``: a control
    /// file written, a truncation, a mapping, a preallocation, rarely an fsync), apart from `pool`:
    /// a head queued behind the fsyncs of files finishing on a slow disk would hold its response
    /// back, and the transport's stall clock runs meanwhile (AsyncHTTPClient's read timeout does
    /// not stop while its delegate holds the body back). Four: heads come a few at a time (the
    /// first answers of a download's connections), and each is short.
    static let headPool: NIOThreadPool = {
        let pool = NIOThreadPool(numberOfThreads: 4)
        pool.start()
        return pool
    }()

    /// Decides a response head on ``headPool``; its result (or error) completes the future on
    /// `loop`, whose event loop must not do the head's file-system work itself.
    static func head<T: Sendable>(on loop: any EventLoop, _ body: @escaping @Sendable () throws -> T) -> EventLoopFuture<T> {
        headPool.runIfActive(eventLoop: loop, body)
    }

    /// Decides a response head on ``headPool`` for a task (FTP's transfers).
    static func head<T: Sendable>(_ body: @escaping @Sendable () throws -> T) async throws -> T {
        try await run(on: headPool, body)
    }

    /// Runs `body` on the pool, not waiting for it.
    static func submit(_ body: @escaping @Sendable () -> Void) {
        pool.submit { state in
            if state == .active { body() }
        }
    }
}
