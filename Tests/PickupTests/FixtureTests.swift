import Foundation
import Testing
import TestServer

/// The test servers tear down when released, so a test that throws before its `stop()` leaves
/// no server listening.
@Suite struct FixtureTests {
    struct Thrown: Error {}

    /// A test body that throws before it stops its servers; returns their ports.
    static func throwingTest(ports: inout [Int]) async throws {
        let server = try await TestServer.start()
        let raw = try await RawServer.start(response: Array("HTTP/1.1 204 No Content\r\n\r\n".utf8))
        ports = [server.port, raw.port]
        #expect(Nginx.canConnect(server.port) && Nginx.canConnect(raw.port))
        throw Thrown()
    }

    @Test func serversLeftByAThrowingTestStopListening() async throws {
        var ports: [Int] = []
        await #expect(throws: Thrown.self) { try await Self.throwingTest(ports: &ports) }
        #expect(ports.count == 2)
        // The close is queued on the event loop when the server is released.
        for port in ports {
            #expect(await eventually(seconds: 10) { !Nginx.canConnect(port) }, "port \(port) still listens")
        }
    }
}
