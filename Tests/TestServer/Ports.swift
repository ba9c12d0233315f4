import NIOConcurrencyHelpers
import NIOCore

/// The loopback ports this test process's servers listen on. None is given out twice in a run, so
/// a client a finished test left behind (a connection still retrying, a child process) never
/// reaches a later test's server and takes the faults or answers meant for that test's client.
enum Ports {
    private static let used = NIOLockedValueBox(Set<Int>())

    /// Whether `port` is new to this run (then it is taken).
    static func claim(_ port: Int) -> Bool { used.withLockedValue { $0.insert(port).inserted } }

    /// Binds with `bind` (port 0: the kernel's choice) until the port is new to this run, within
    /// 100 tries; the refused ones stay bound until then, so the kernel cannot offer them again.
    static func bindNew(_ bind: () async throws -> any Channel) async throws -> any Channel {
        var refused: [any Channel] = []
        defer { for c in refused { c.close(promise: nil) } }
        for _ in 0..<100 {
            let channel = try await bind()
            if claim(channel.localAddress?.port ?? 0) { return channel }
            refused.append(channel)
        }
        throw ChannelError.inappropriateOperationForState
    }
}
