import Foundation

/// Starting and stopping a real server program (nginx, proxies, FTP servers) for a test.
enum LocalServer {
    /// Runs `binary` with its output in `work/out.log` and returns once something accepts
    /// connections on `port`, within `seconds`; else kills it and throws with what `logs` (paths)
    /// and its output say.
    static func launch(_ binary: String, _ arguments: [String], work: String, port: Int, seconds: Double, name: String,
                       logs: [String] = []) throws -> Process {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: binary)
        process.arguments = arguments
        _ = FileManager.default.createFile(atPath: work + "/out.log", contents: nil)
        let out = FileHandle(forWritingAtPath: work + "/out.log")
        process.standardOutput = out
        process.standardError = out
        try process.runWithSignalsUnblocked()
        try? out?.close()  // the child has its own copy
        let deadline = Date().addingTimeInterval(seconds)
        while !Nginx.canConnect(port) {
            guard Date() < deadline, process.isRunning else {
                let said = (logs + [work + "/out.log"]).compactMap { try? String(contentsOfFile: $0, encoding: .utf8) }.joined()
                stop(process, work: nil)
                throw NSError(domain: "\(name) did not start: \(said)", code: 2)
            }
            usleep(20_000)
        }
        return process
    }

    /// Kills it (SIGKILL: nothing of a test server's needs a clean exit), reaps it, and removes
    /// its folder.
    static func stop(_ process: Process, work: String?) {
        if process.isRunning {
            kill(process.processIdentifier, SIGKILL)
            process.waitUntilExit()
        }
        if let work { try? FileManager.default.removeItem(atPath: work) }
    }
}

extension Process {
    /// `run()` with no signal blocked in the child. A child inherits the signal mask of the thread
    /// that starts it, and the test runner's threads (Dispatch's, the cooperative pool's) block
    /// nearly every signal: a server started from one never sees SIGCHLD, so it never reaps its
    /// sessions (vsftpd then counts every ended session against `max_clients` and refuses all
    /// after 64), nor SIGTERM. A shell starts programs with none blocked, as users do.
    public func runWithSignalsUnblocked() throws {
        var none = sigset_t(), old = sigset_t()
        sigemptyset(&none)
        pthread_sigmask(SIG_SETMASK, &none, &old)
        defer { pthread_sigmask(SIG_SETMASK, &old, nil) }
        try run()
    }
}
