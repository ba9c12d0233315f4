import Foundation
import SystemPackage

/// A stream's bytes on their way to its `write`, which runs on a thread of its own: the
/// transport's thread (an event loop) copies each chunk into a ring allocated once and never
/// waits on a slow reader. While more than half the ring is queued the sink asks for a pause, so
/// the connection's reads wait; a chunk that finds no room (a reader that keeps falling behind)
/// fails the response as a transient error, and the stream goes on from the bytes handed over.
final class StreamOutput: @unchecked Sendable {
    static let capacity = 8 << 20
    /// The pause asked for while more than half the ring is queued, in seconds.
    static let pause = 0.05

    private let ring = UnsafeMutableRawBufferPointer.allocate(byteCount: capacity, alignment: 16)
    private let condition = NSCondition()
    private let write: @Sendable (UnsafeRawBufferPointer) throws -> Void
    // Under `condition`:
    private var start = 0, queued = 0
    private var closed = false, abandoned = false, done = false
    private var failure: (any Error)?
    private var progressed = Clock.monotonic()

    init(write: @escaping @Sendable (UnsafeRawBufferPointer) throws -> Void) {
        self.write = write
        let thread = Thread { [self] in drain() }
        thread.name = "pickup-stdout"
        thread.start()
    }

    deinit { ring.deallocate() }

    /// Queues `bytes` (copied) and returns the pause to ask for. Throws the writer's failure, or a
    /// transient error when the ring has no room for them.
    func put(_ bytes: UnsafeRawBufferPointer) throws -> Double {
        condition.lock()
        defer { condition.unlock() }
        if let failure { throw failure }
        guard bytes.count <= Self.capacity - queued else {
            throw TransportError.transient("standard output's reader is slower than the network")
        }
        var from = 0
        while from < bytes.count {
            let at = (start + queued) % Self.capacity
            let n = min(bytes.count - from, Self.capacity - at)
            UnsafeMutableRawBufferPointer(rebasing: ring[at..<(at + n)])
                .copyMemory(from: UnsafeRawBufferPointer(rebasing: bytes[from..<(from + n)]))
            from += n
            queued += n
        }
        condition.signal()
        return queued > Self.capacity / 2 ? Self.pause : 0
    }

    /// No more bytes: returns once every queued byte is written, or throws the writer's failure,
    /// or a time-out when the reader took nothing for `stall` seconds. Blocks: on the blocking pool.
    func close(stall: Double) throws {
        condition.lock()
        defer { condition.unlock() }
        closed = true
        condition.signal()
        while !done {
            if let failure { throw failure }
            if Clock.monotonic() - progressed > stall {
                throw PickupError.fileSystem("-", Errno.timedOut)
            }
            _ = condition.wait(until: Date().addingTimeInterval(min(stall, 1)))
        }
        if let failure { throw failure }
    }

    /// The stream failed: what is queued is dropped and the writer thread ends (once its write
    /// in progress, if any, returns). Does not wait.
    func abandon() {
        condition.lock()
        closed = true
        abandoned = true
        condition.broadcast()
        condition.unlock()
    }

    /// The writer thread: writes what is queued, in order, until closed and empty or failed.
    private func drain() {
        condition.lock()
        while true {
            while queued == 0 && !closed { condition.wait() }
            if queued == 0 || abandoned { break }
            let (from, n) = (start, min(queued, Self.capacity - start))
            condition.unlock()
            do {
                try write(UnsafeRawBufferPointer(rebasing: ring[from..<(from + n)]))
            } catch {
                condition.lock()
                failure = error
                break
            }
            condition.lock()
            start = (start + n) % Self.capacity
            queued -= n
            progressed = Clock.monotonic()
            condition.broadcast()
        }
        done = true
        condition.broadcast()
        condition.unlock()
    }
}
