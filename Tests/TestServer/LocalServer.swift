import Foundation

/// Starting and stopping a real server program (nginx, proxies, FTP servers) for a test.
enum LocalServer {
    /// Runs `binary` with its output in `work/out.log` and returns once something accepts
    /// connections on `port`, within `seconds`; else kills it and throws with what `logs` (paths)
    /// and its output say.
    static func launch(_ binary: String, _ arguments: [String], work: String, port: Int, seconds: Double, name: String,
                       logs: [String] = [], output: Bool = true) async throws -> Child {
        let log = work + "/out.log"
        _ = FileManager.default.createFile(atPath: log, contents: nil)
        let child = try await Child.start(binary, arguments, output: output ? .file(log) : .null, errors: output ? .sameAsOutput : .null)
        guard await eventually(seconds: seconds, every: 0.02, { Nginx.canConnect(port) || !child.isRunning }), child.isRunning else {
            let said = (logs + [log]).compactMap { try? String(contentsOfFile: $0, encoding: .utf8) }.joined()
            await child.stop()
            throw NSError(domain: "\(name) did not start (\(child.status.map { "\($0)" } ?? "no answer")): \(said)", code: 2)
        }
        return child
    }

    /// Kills it and its process group (SIGKILL: nothing of a test server's needs a clean exit),
    /// and removes its folder. Reaping is swift-subprocess's (it is not waited for here: this runs
    /// in `deinit` too).
    static func stop(_ child: Child, work: String?) {
        child.kill()
        if let work { try? FileManager.default.removeItem(atPath: work) }
    }
}
