import Atomics
import Foundation
import SystemPackage

/// The sink for one attempt: decides on the response head (through ``FileDownload``) and then
/// writes the body at its offset in the partial file.
///
/// `receiveBody` is the per-chunk path: one `pwrite`, two atomic stores, no allocation, no lock,
/// no actor hop, no await.
final class BodyWriter: ResponseSink, @unchecked Sendable {
    // The transport calls this object from one thread at a time, in order (head, then body parts);
    // the engine reads `decision` only after `fetch` has returned. Cross-thread readers use the atomics.
    let download: FileDownload
    let context: RequestContext
    let file: PartialFile
    private(set) var decision: ResponseDecision?
    private var writing = false
    private var offset: Int64 = 0
    private var discarded = 0

    /// Bodies of redirects and errors are read and dropped, up to this many bytes.
    static let maxDiscard = 1 << 20

    init(download: FileDownload, context: RequestContext, file: PartialFile) {
        self.download = download
        self.context = context
        self.file = file
    }

    func receiveHead(_ head: ResponseHead) throws {
        let d = ResponseDecision.decide(head, context: context, now: Clock.wallSeconds())
        decision = d
        if let start = try download.beginWriting(decision: d, head: head, context: context) {
            offset = start
            writing = true
        }
    }

    @inline(__always)
    func receiveBody(_ bytes: UnsafeRawBufferPointer) throws {
        guard writing else {
            discarded += bytes.count
            if discarded > Self.maxDiscard { throw TransportError.transient("response body to discard is too large") }
            return
        }
        do {
            try file.write(bytes, at: offset)
        } catch {
            throw PickupError.io(file.path.string, error)
        }
        offset += Int64(bytes.count)
        download.position.store(offset, ordering: .releasing)
        download.transferred.wrappingIncrement(by: Int64(bytes.count), ordering: .relaxed)
    }
}

/// Clocks used by the engine.
enum Clock {
    /// Seconds since the epoch (for HTTP dates).
    static func wallSeconds() -> Int64 { Int64(Date().timeIntervalSince1970) }

    /// Monotonic seconds, for speeds and intervals.
    static func monotonic() -> Double {
        let d = ContinuousClock.now - start
        return Double(d.components.seconds) + Double(d.components.attoseconds) / 1e18
    }

    static let start = ContinuousClock.now
}
