import ArgumentParser
import Foundation
import Pickup
import SystemPackage

extension Get {
    /// `-o -`: the file to standard output as it arrives, and nothing else there; what is said goes
    /// to standard error. Nothing is kept on disk, so a later run starts over (said once).
    func stream(_ url: String) async throws {
        // A reader that goes away (`| head`) is a write error to report, not a signal that kills.
        signal(SIGPIPE, SIG_IGN)
        let request = DownloadRequest(
            url: url, destination: .file("-"), checksum: checksum.flatMap(ExpectedDigest.init(checksumArgument:)),
            limiters: limitRate.flatMap(Self.rate).map { [RateLimiter(bytesPerSecond: $0)] } ?? [], options: try http.options(for: url))
        let display = ProgressDisplay(quiet: quiet, name: ProgressDisplay.name(of: url))
        var (options, transport) = engine.settings()
        if verbose { transport.trace = { display.line($0) } }
        let downloader = Downloader(options: options, transport: transport)
        if !quiet { display.line("pickup: writing to standard output: not resumable (nothing is kept on disk; an interrupted run starts over)") }
        let signals = SignalTrap()
        let task = Task {
            try await downloader.stream(request, write: { try FileDescriptor.standardOutput.writeAll($0) }) { display.handle($0) }
        }
        await signals.onSignal { _ in task.cancel() }
        let result = await task.result
        await downloader.shutdown()
        display.clear()
        switch result {
        case .success(let r):
            if !quiet {
                let speed = r.elapsed > 0 ? Double(r.size) / r.elapsed : 0
                display.line("pickup: wrote \(ByteCount.format(r.size)) to standard output in \(String(format: "%.1f", r.elapsed)) s, "
                    + "\(ByteCount.format(Int64(speed)))/s average")
            }
        case .failure(let any):
            let error = (any as? PickupError) ?? .network("\(any)")
            if case .interrupted = error {
                display.line("pickup: interrupted")
                throw ExitCode(signals.received == SIGTERM ? Exit.terminated : Exit.interrupted)
            }
            if case .fileSystem("-", let errno) = error {
                let why = errno == .brokenPipe ? "its reader has gone" : errno == .timedOut ? "its reader stopped taking bytes" : errno.description
                display.line("pickup: cannot write to standard output: \(why)")
            } else {
                display.line("pickup: \(error)")
            }
            throw ExitCode(Self.code(for: error))
        }
    }
}
