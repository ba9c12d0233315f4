import Foundation
import Pickup

/// Progress on standard error: one line redrawn at most ten times a second on a terminal, a plain
/// line every few seconds on a pipe, nothing with --quiet.
final class ProgressDisplay: @unchecked Sendable {
    private let lock = NSLock()
    private let quiet: Bool
    private let tty: Bool
    private var lastDraw = 0.0
    private var drawn = false
    private let started = Date()

    init(quiet: Bool) {
        self.quiet = quiet
        self.tty = isatty(STDERR_FILENO) != 0
    }

    func handle(_ event: DownloadEvent) {
        guard !quiet else { return }
        switch event {
        case .notice(let text):
            // Extra URLs are mirrors of one file (aria2c's convention): one that is another file says how to get each.
            let hint = text.contains(DownloadEvent.notTheSameFile) ? "; use -Z to download each URL as its own file" : ""
            line("pickup: \(text)\(hint)")
        case .progress(let p):
            // Nothing has answered yet (connecting, or retrying a refused connection, whose
            // notices say so): a line of zeros would say nothing.
            if p.bytesDone == 0, p.totalBytes == nil, p.stallTimeout == nil { return }
            lock.withLock {
                let now = Date().timeIntervalSince(started)
                let interval = tty ? 0.1 : 5
                guard now - lastDraw >= interval else { return }
                lastDraw = now
                let text = Self.describe(p)
                if tty {
                    write("\r\u{1B}[K" + text)
                    drawn = true
                } else {
                    write(text + "\n")
                }
            }
        }
    }

    static func describe(_ p: DownloadProgress) -> String {
        var parts = [ByteCount.format(p.bytesDone)]
        if let total = p.totalBytes { parts[0] += " / " + ByteCount.format(total) }
        if let f = p.fraction { parts.append(String(format: "%5.1f%%", f * 100)) }
        parts.append(ByteCount.format(Int64(p.bytesPerSecond)) + "/s")
        if let left = p.secondsLeft { parts.append(duration(left) + " left") }
        if let wait = p.stallTimeout { parts.append("(slow server: waiting up to \(duration(wait)) for data)") }
        return parts.joined(separator: "  ")
    }

    static func duration(_ s: Double) -> String {
        let t = Int(Seconds.clamped(s).rounded())
        if t >= 3600 { return "\(t / 3600)h\(String(format: "%02d", t % 3600 / 60))m" }
        if t >= 60 { return "\(t / 60)m\(String(format: "%02d", t % 60))s" }
        return "\(t)s"
    }

    /// A line of its own (errors always; notices unless quiet), clearing the progress line first.
    func line(_ text: String) {
        lock.withLock {
            if drawn { write("\r\u{1B}[K") }
            drawn = false
            write(text + "\n")
        }
    }

    func clear() {
        lock.withLock {
            if drawn { write("\r\u{1B}[K") }
            drawn = false
        }
    }

    func finished(_ r: DownloadResult) {
        guard !quiet else { return }
        switch r.outcome {
        case .unchanged, .metalink:
            break  // (the download's notice said it; a Metalink document's files are a batch, which speaks for itself)
        case .downloaded:
            let speed = r.elapsed > 0 ? Double(r.bytesTransferred) / r.elapsed : 0
            var text = "saved \(r.path) (\(ByteCount.format(r.size))) in \(String(format: "%.1f", r.elapsed)) s, \(ByteCount.format(Int64(speed)))/s average"
            if r.resumedFrom > 0 { text += ", resumed from \(ByteCount.format(r.resumedFrom))" }
            line(text)
        }
    }

    private func write(_ s: String) {
        FileHandle.standardError.write(Data(s.utf8))
    }
}
