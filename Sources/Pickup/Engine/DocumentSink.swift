import Foundation

/// A small document read whole into memory, at most `limit` bytes (more is refused, not read).
/// The transport calls it from one thread at a time, in order; it is read after `fetch` returns.
final class DocumentSink: ResponseSink, @unchecked Sendable {
    struct TooLarge: SinkError {}
    let limit: Int
    private(set) var head: ResponseHead?
    private(set) var bytes: [UInt8] = []

    init(limit: Int) { self.limit = limit }

    func receiveHead(_ head: ResponseHead) throws { self.head = head }

    func receiveBody(_ chunk: UnsafeRawBufferPointer) throws -> Double {
        guard bytes.count + chunk.count <= limit else { throw TooLarge() }
        bytes.append(contentsOf: chunk)
        return 0
    }
}
